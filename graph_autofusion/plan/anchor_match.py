"""`AnchorMatch`: what an anchor kernel is, decided once for the planner and the lowering.

    match = match_anchor(spec)       # raises Unsupported with the sentence saying why not
    kernel = lower_anchor(spec, match)  # lower/anchor.py renders a MatMul/Gemm match as kernel IR

As with `ReductionMatch`, the planner builds the spec a group would become (`group_spec`) and asks
this function, so a group it accepts as an `anchor` always lowers: legality is "the match
succeeds". A match is

- the anchor node and its operands, each seen through its stride-only prologue chain
  (Transpose / Reshape / Squeeze / Unsqueeze / Flatten / Split / step-1 Slice on a MatMul input)
  folded into an `OperandView`: base tensor, element offset, shape and strides, never a copy;
- for MatMul/Gemm the `Contraction`: batch dims, M/N/K, each operand as a `MatrixView` (offset,
  row/column strides, batch strides; whether BLAS reads it transposed or needs it packed follows
  from the strides), alpha, and where the output rows go;
- the epilogue: the elementwise/broadcast ops and views applied to the anchor's output, in order,
  Gemm's `beta * C` as the `addend` in front of them;
- the output tail: one Transpose after a MatMul/Gemm that keeps the last axis last, folded into
  where the GEMM stores each tile (`OutputTail`);
- the row norm: a LayerNormalization over the last axis closing a MatMul/Gemm epilogue
  (`RowNorm`), when a row of the product is short enough (ROW_NORM_MAX_COLUMNS) for the tile
  loop to run full rows: its mean and variance are then row reductions over the hot tile, and
  the residual stream feeding it need not make a round trip through memory to a kernel of its own;
- the pool prologue: a GlobalAveragePool feeding a MatMul/Gemm's left operand through views
  (a CNN's `GlobalAveragePool -> Flatten -> Gemm` classifier, `PoolPrologue`): the kernel
  averages the rows a tile reads into a small workspace right before its contraction.

`to_json` is the form the exporter writes into the fused function's doc_string
(docs/fused-format.md). Conv/ConvTranspose matches carry no contraction (lower/conv.py computes
their geometry).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from ..backend.cpu.kernel_spec import KernelSpec
from ..layout import reshape_strides, slice_window, split_sizes
from ..lower.values import Unsupported, attrs_of
from ..ops import OpKind, lookup

ANCHOR_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})
GEMM_OPS = frozenset({"MatMul", "Gemm"})
STRIDE_PROLOGUE_OPS = frozenset({"Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Split", "Slice"})
# Views an epilogue may contain: they keep the element order, so the epilogue still runs on the
# tile's linear index (Dropout is a view op too, but no generator reads its mask).
EPILOGUE_VIEW_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"})
# What a tensor crossing an anchor kernel's boundary may be (`match_anchor(float_types=...)`).
FP32 = frozenset({onnx.TensorProto.FLOAT})
# Integer/bool constants up to this size are inlined into a kernel (extract.CONST_MAX_INT_ELEMENTS).
INLINED_INT_CONSTANT = 4096
# Widest product row a LayerNormalization epilogue normalises: the tile loop then runs tiles of
# whole rows, and 8 rows of this many floats (128 KiB) still stay in L2 between the contraction
# and the normalisation (lower/anchor.py sizes the row tile).
ROW_NORM_MAX_COLUMNS = 4096
# The smallest tensor between its two convs (bytes) a conv chain takes (`_conv_chain`). Below it
# the two kernels pass it through the cache, and each runs its own better tiling: the chain's
# bands give the 1x1 conv few pixels per call (lower/conv_chain.py). MobileNetV2's blocks in the
# model, two threads, the chain against the two kernels (Intel Xeon with AVX-512): 4.8 MB
# expansion (112x112) 0.59, 1.8 MB (56x56) 0.80 and 0.88; 602 KB (28x28) 0.96-1.23, 301-451 KB
# (14x14) 0.95-1.63, 188 KB (7x7) 1.8-1.96.
CONV_CHAIN_MIN_BYTES = 1 << 20


def dense_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major element strides of a dense tensor."""
    return tuple(math.prod(int(d) for d in shape[a + 1 :]) for a in range(len(shape)))


@dataclass(frozen=True)
class OperandView:
    """An anchor input read in place: element i lives at `tensor[offset + sum(i_d * strides_d)]`.

    `through` names the prologue nodes folded in (empty: the tensor itself, dense)."""

    tensor: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int = 0
    through: tuple[str, ...] = ()


@dataclass(frozen=True)
class MatrixView:
    """One GEMM operand: `rows x cols`, element (i, j) of batch entry b at
    `tensor[offset + batch_offset(b) + i * rs + j * cs]`."""

    tensor: str
    offset: int
    rows: int
    cols: int
    rs: int
    cs: int
    batch_strides: tuple[int, ...]

    def blas(self) -> tuple[bool, int] | None:
        """(transposed, leading dimension) when BLAS reads it in place; None: pack it first."""
        if self.cols == 1 or self.cs == 1:
            ld = self.rs if self.rows > 1 else self.cols
            if ld >= max(1, self.cols):
                return False, ld
        if self.rows == 1 or self.rs == 1:
            ld = self.cs if self.cols > 1 else self.rows
            if ld >= max(1, self.rows):
                return True, ld
        return None


@dataclass(frozen=True)
class Contraction:
    """`Y[b] = alpha * A[b] @ B[b]` for every index b of `batch` (batch dims B shares with every
    row of A folded into M). Row i of batch entry b of Y starts at
    `batch_offset(b, c_batch_strides) + i * c_rs`; columns are unit-stride."""

    batch: tuple[int, ...]
    m: int
    n: int
    k: int
    a: MatrixView
    b: MatrixView
    alpha: float
    c_rs: int
    c_batch_strides: tuple[int, ...]

    @property
    def batch_count(self) -> int:
        return math.prod(self.batch)

    @property
    def macs(self) -> int:
        return self.batch_count * self.m * self.n * self.k


@dataclass(frozen=True)
class Addend:
    """Gemm's `beta * C`, added to the product before the epilogue (C broadcasts to [M, N])."""

    tensor: str
    beta: float
    shape: tuple[int, ...]


@dataclass(frozen=True)
class OutputTail:
    """An output Transpose folded into the GEMM's stores: `value` (the Transpose's input) lands in
    kernel output `output` (the Transpose's output or a view of it) with the anchor output's axes
    at element strides `strides`."""

    value: str
    output: str
    strides: tuple[int, ...]
    through: tuple[str, ...]  # the Transpose and the views after it


@dataclass(frozen=True)
class RowNorm:
    """LayerNormalization `node` over the last axis of `value` (the anchor output or an epilogue
    value, on the anchor's domain) as the kernel's last stage: `output` =
    `(value - mean) / sqrt(var + epsilon) * scale + bias`, mean and variance over each row of
    `columns` elements (the contraction's N); `scale` and `bias` are kernel inputs of `columns`
    elements (bias None: none); `output` is the LayerNormalization's output or a view of it."""

    node: str
    value: str
    scale: str
    bias: str | None
    epsilon: float
    output: str
    columns: int
    through: tuple[str, ...] = ()  # views after the LayerNormalization, `output` the last leaving


@dataclass(frozen=True)
class PoolPrologue:
    """GlobalAveragePool `node` of kernel input `tensor` (`[N, C, spatial...]`), computed into a
    workspace holding `value` (its output, `entries` = N * C floats, dense) right before the
    contraction that reads it, through the views after it, as the left operand: entry e is the
    mean of `tensor[e * window : (e + 1) * window]`."""

    node: str
    tensor: str
    value: str
    entries: int
    window: int


@dataclass(frozen=True)
class AnchorMatch:
    """One anchor kernel: an anchor with prologue views, epilogue steps and an output tail."""

    anchor: onnx.NodeProto
    operands: tuple[OperandView, ...]  # the anchor's inputs, prologues folded in
    contraction: Contraction | None  # MatMul / Gemm only
    addend: Addend | None
    epilogue: tuple[onnx.NodeProto, ...]  # before the tail, in body order
    tail: OutputTail | None
    domain: tuple[int, ...]  # the anchor output's shape
    split: int  # leading domain dims that index a tile row; the rest index its columns
    norm: RowNorm | None = None  # a LayerNormalization after the epilogue, over whole rows
    pool: PoolPrologue | None = None  # a GlobalAveragePool computing the left operand

    @property
    def row_len(self) -> int:
        return math.prod(self.domain[self.split :])

    def to_json(
        self, tensor: Callable[[str], str] = str, node: Callable[[str], str] = str
    ) -> dict[str, object]:
        """The match as plain data, names mapped through `tensor` and `node` (the exporter's
        canonical names)."""

        def view(v: OperandView) -> dict[str, object]:
            return {
                "tensor": tensor(v.tensor),
                "shape": list(v.shape),
                "strides": list(v.strides),
                "offset": v.offset,
                "through": [node(n) for n in v.through],
            }

        out: dict[str, object] = {
            "kind": "anchor",
            "anchor": node(self.anchor.name),
            "op": self.anchor.op_type,
            "operands": [view(v) for v in self.operands],
            "epilogue": [node(n.name) for n in self.epilogue],
            "domain": list(self.domain),
            "split": self.split,
        }
        c = self.contraction
        if c is not None:

            def matrix(mv: MatrixView) -> dict[str, object]:
                layout = mv.blas()
                return {
                    "tensor": tensor(mv.tensor),
                    "offset": mv.offset,
                    "rows": mv.rows,
                    "cols": mv.cols,
                    "strides": [mv.rs, mv.cs],
                    "batch_strides": list(mv.batch_strides),
                    "transpose": None if layout is None else layout[0],
                }

            out["contraction"] = {
                "batch": list(c.batch),
                "m": c.m,
                "n": c.n,
                "k": c.k,
                "a": matrix(c.a),
                "b": matrix(c.b),
                "alpha": c.alpha,
                "c_rs": c.c_rs,
                "c_batch_strides": list(c.c_batch_strides),
            }
        if self.addend is not None:
            out["addend"] = {
                "tensor": tensor(self.addend.tensor),
                "beta": self.addend.beta,
                "shape": list(self.addend.shape),
            }
        if self.norm is not None:
            rn = self.norm
            out["norm"] = {
                "node": node(rn.node),
                "value": tensor(rn.value),
                "scale": tensor(rn.scale),
                "bias": None if rn.bias is None else tensor(rn.bias),
                "epsilon": rn.epsilon,
                "output": tensor(rn.output),
                "columns": rn.columns,
                "through": [node(m) for m in rn.through],
            }
        if self.pool is not None:
            pp = self.pool
            out["pool"] = {
                "node": node(pp.node),
                "tensor": tensor(pp.tensor),
                "value": tensor(pp.value),
                "entries": pp.entries,
                "window": pp.window,
            }
        if self.tail is not None:
            out["tail"] = {
                "value": tensor(self.tail.value),
                "output": tensor(self.tail.output),
                "strides": list(self.tail.strides),
                "through": [node(n) for n in self.tail.through],
            }
        return out


# -- the match --------------------------------------------------------------------------------------


class _Body:
    """A spec's nodes with producers, consumers and compile-time constants."""

    def __init__(self, spec: KernelSpec) -> None:
        self.spec = spec
        self.nodes = [n for n in spec.nodes if n.op_type != "Constant"]
        self.constants: dict[str, np.ndarray] = {k: np.asarray(v) for k, v in spec.constants.items()}
        for n in spec.nodes:
            if n.op_type == "Constant":
                self.constants[n.output[0]] = _constant_of(n)
        self.producer = {o: n for n in self.nodes for o in n.output if o}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for n in self.nodes:
            for x in n.input:
                if x:
                    self.consumers.setdefault(x, []).append(n)
        self.outputs = {t.name for t in spec.outputs}

    def shape(self, name: str) -> tuple[int, ...]:
        if name in self.spec.tensors:
            return tuple(self.spec.tensors[name].shape)
        if name in self.constants:
            return tuple(self.constants[name].shape)
        raise Unsupported(f"no shape known for tensor {name!r}")

    def numel(self, name: str) -> int:
        return math.prod(self.shape(name))

    def ints(self, node: onnx.NodeProto, slot: int, what: str) -> list[int] | None:
        if len(node.input) <= slot or not node.input[slot]:
            return None
        value = self.constants.get(node.input[slot])
        if value is None:
            raise Unsupported(
                f"{node.op_type} '{node.name}' input {slot} ('{node.input[slot]}') is not a constant"
            )
        return [int(v) for v in value.reshape(-1)]

    def descendants(self, node: onnx.NodeProto) -> list[onnx.NodeProto]:
        seen: dict[int, onnx.NodeProto] = {}
        stack = [o for o in node.output if o]
        while stack:
            for c in self.consumers.get(stack.pop(), []):
                if id(c) not in seen:
                    seen[id(c)] = c
                    stack.extend(o for o in c.output if o)
        return [n for n in self.nodes if id(n) in seen]

    def ancestors(self, node: onnx.NodeProto) -> list[onnx.NodeProto]:
        seen: dict[int, onnx.NodeProto] = {}
        stack = [x for x in node.input if x]
        while stack:
            p = self.producer.get(stack.pop())
            if p is not None and id(p) not in seen:
                seen[id(p)] = p
                stack.extend(x for x in p.input if x)
        return [n for n in self.nodes if id(n) in seen]


def _constant_of(node: onnx.NodeProto) -> np.ndarray:
    for attr in node.attribute:
        value = onnx.helper.get_attribute_value(attr)
        if attr.name == "value":
            return onnx.numpy_helper.to_array(value)
        if attr.name in ("value_float", "value_floats"):
            return np.asarray(value, dtype=np.float32)
        if attr.name in ("value_int", "value_ints"):
            return np.asarray(value, dtype=np.int64)
    raise Unsupported(f"Constant '{node.name}' has no value this backend reads")


def match_anchor(spec: KernelSpec, *, float_types: Collection[int] = FP32) -> AnchorMatch:
    """The anchor kernel `spec` forms; raises `Unsupported` saying why it forms none.

    `float_types`: the element types a tensor may cross the kernel's boundary as. The planner
    and the CPU lowering take fp32 only; the Triton targets multiply fp16/bf16 operands too."""
    body = _Body(spec)
    anchors = [n for n in body.nodes if n.op_type in ANCHOR_OPS]
    if len(anchors) != 1:
        raise Unsupported(f"an anchor kernel has exactly one anchor, found {len(anchors)}")
    anchor = anchors[0]
    ancestors = body.ancestors(anchor)
    pool = _pool_prologue(body, anchor, ancestors)
    prologue = [n for n in ancestors if pool is None or n.op_type != "GlobalAveragePool"]
    operands = _prologue(body, anchor, prologue, pool)
    epilogue, tail_nodes, norm_node = _epilogue(body, anchor, ancestors)
    _float_boundary(body, float_types)
    y = anchor.output[0]
    domain = body.shape(y)
    tail = _output_tail(body, anchor, tail_nodes) if tail_nodes else None
    contraction: Contraction | None = None
    addend: Addend | None = None
    split = min(2, len(domain))  # Conv: rows are (N, C), columns the spatial dims
    if anchor.op_type == "Gemm":
        contraction = _gemm(anchor, operands, tail)
        addend = _addend(body, anchor, contraction)
        split = len(domain) - 1
    elif anchor.op_type == "MatMul":
        contraction = _matmul(operands, tail)
        b_vector = len(operands[1].shape) == 1
        split = len(domain) if b_vector else len(domain) - 1
    if contraction is not None and math.prod(domain) and contraction.n != math.prod(domain[split:]):
        raise Unsupported(f"{anchor.op_type} '{anchor.name}' rows do not match its output {list(domain)}")
    norm = None
    if norm_node is not None:
        if contraction is None:
            raise Unsupported(
                f"LayerNormalization after {anchor.op_type} '{anchor.name}' normalises no GEMM rows"
            )
        norm = _row_norm(body, anchor, *norm_node, contraction.n, tail, domain, split)
    return AnchorMatch(
        anchor, operands, contraction, addend, tuple(epilogue), tail, domain, split, norm, pool
    )


def _pool_prologue(
    body: _Body, anchor: onnx.NodeProto, ancestors: list[onnx.NodeProto]
) -> PoolPrologue | None:
    """The GlobalAveragePool among the anchor's ancestors, if any: of a kernel input, its output
    read only by the views into the left operand (`_prologue` checks the views)."""
    pools = [n for n in ancestors if n.op_type == "GlobalAveragePool"]
    if not pools:
        return None
    if len(pools) > 1 or anchor.op_type not in GEMM_OPS:
        raise Unsupported(f"{anchor.op_type} '{anchor.name}' takes one pooled operand at most")
    node = pools[0]
    x, y = node.input[0], node.output[0]
    if x in body.producer:
        raise Unsupported(
            f"GlobalAveragePool '{node.name}' before {anchor.op_type} pools a value computed here"
        )
    shape = body.shape(x)
    if len(shape) < 3:
        raise Unsupported(f"GlobalAveragePool '{node.name}' of shape {list(shape)} has no spatial axes")
    if y in body.outputs:
        raise Unsupported(f"GlobalAveragePool '{node.name}' output '{y}' leaves the kernel")
    return PoolPrologue(node.name, x, y, shape[0] * shape[1], math.prod(shape[2:]))


def _prologue(
    body: _Body, anchor: onnx.NodeProto, prologue: list[onnx.NodeProto], pool: PoolPrologue | None = None
) -> tuple[OperandView, ...]:
    """Each anchor input through its prologue chain, checked to be a pure stride change (back to
    the pooled workspace for the left operand of a pool prologue)."""
    if prologue and anchor.op_type != "MatMul" and pool is None:
        raise Unsupported(f"{anchor.op_type} takes no fused prologue")
    for n in prologue:
        if n.op_type not in STRIDE_PROLOGUE_OPS:
            raise Unsupported(f"{n.op_type} '{n.name}' before {anchor.op_type} would need a copy")
    used: set[int] = set()
    read: set[str] = set()
    views = []
    for slot, name in enumerate(anchor.input):
        if not name:
            continue
        view, chain, values = _trace(body, name, anchor, pool.value if pool is not None else None)
        if pool is not None and (view.tensor == pool.value) != (slot == 0):
            raise Unsupported(
                f"the pooled value does not reach {anchor.op_type} '{anchor.name}' as its left operand"
            )
        if chain and (len(view.shape) < 2 or 1 not in view.strides[-2:]):
            raise Unsupported(
                f"the layout change feeding {anchor.op_type} '{anchor.name}' is not a stride change"
            )
        used.update(id(n) for n in chain)
        read.update(values)
        views.append(view)
    if used != {id(n) for n in prologue}:
        raise Unsupported("prologue nodes do not form chains into the contraction")
    chained = {id(anchor)} | used
    if pool is not None and any(id(c) not in chained for c in body.consumers.get(pool.value, [])):
        raise Unsupported(f"GlobalAveragePool '{pool.node}' feeds {anchor.op_type} and other consumers")
    for n in prologue:
        for o in n.output:
            if not o:
                continue
            if o in read:
                if o in body.outputs or any(id(c) not in chained for c in body.consumers.get(o, [])):
                    raise Unsupported(f"'{n.name}' feeds {anchor.op_type} and other consumers")
            elif o in body.outputs or body.consumers.get(o):
                # A kernel reads its prologue in place and stores nothing of it: a Split output
                # read elsewhere would need the Split as a kernel of its own (or recomputed).
                raise Unsupported(
                    f"{n.op_type} '{n.name}' output '{o}' is read outside the chains into "
                    f"{anchor.op_type} '{anchor.name}'"
                )
    return tuple(views)


def _trace(
    body: _Body, name: str, anchor: onnx.NodeProto, stop: str | None = None
) -> tuple[OperandView, list[onnx.NodeProto], list[str]]:
    """`name` followed back through stride-only ops to a kernel input or constant (or to `stop`,
    a value the kernel computes into a dense workspace first)."""
    chain: list[onnx.NodeProto] = []
    values: list[str] = []
    value = name
    node = body.producer.get(value)
    while node is not None and value != stop:
        if node.op_type not in STRIDE_PROLOGUE_OPS:
            raise Unsupported(f"{node.op_type} '{node.name}' feeding an anchor is not a stride-only prologue")
        chain.append(node)
        values.append(value)
        value = node.input[0]
        node = body.producer.get(value)
    chain.reverse()
    values.reverse()
    shape = body.shape(value)
    strides = dense_strides(shape)
    offset = 0
    for node, out in zip(chain, values, strict=True):
        out_shape = body.shape(out)
        if node.op_type == "Transpose":
            perm = [int(p) for p in (attrs_of(node).get("perm") or reversed(range(len(shape))))]  # type: ignore[call-overload]
            shape = tuple(shape[p] for p in perm)
            strides = tuple(strides[p] for p in perm)
        elif node.op_type in ("Split", "Slice"):
            begin, window = _window(body, node, out, shape)
            offset += sum(b * s for b, s in zip(begin, strides, strict=True))
            shape = window
        else:
            new = reshape_strides(shape, strides, out_shape)
            if new is None:
                raise Unsupported(
                    f"the layout change feeding {anchor.op_type} '{anchor.name}' is not a stride change"
                )
            shape, strides = out_shape, new
        if tuple(shape) != tuple(out_shape):
            raise Unsupported(f"{node.op_type} '{node.name}' yields {list(shape)}, not {list(out_shape)}")
    view = OperandView(value, tuple(shape), tuple(strides), offset, tuple(n.name for n in chain))
    return view, chain, values


def _window(
    body: _Body, node: onnx.NodeProto, value: str, shape: tuple[int, ...]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(first index, shape) of output `value` of a Split or a step-1 Slice over `shape`."""
    rank = len(shape)
    attrs = attrs_of(node)
    if node.op_type == "Split":
        axis = int(attrs.get("axis", 0)) % max(rank, 1)  # type: ignore[call-overload]
        given = body.ints(node, 1, "Split sizes")
        if given is None and attrs.get("split") is not None:
            given = [int(v) for v in attrs["split"]]  # type: ignore[union-attr]
        sizes = split_sizes(shape[axis], len(node.output), given)
        if sizes is None:
            raise Unsupported(f"Split '{node.name}' sizes do not cover its axis")
        k = list(node.output).index(value)
        begin, out = [0] * rank, list(shape)
        begin[axis], out[axis] = sum(sizes[:k]), sizes[k]
        return tuple(begin), tuple(out)
    if len(node.input) > 1:
        starts, ends = body.ints(node, 1, "Slice starts"), body.ints(node, 2, "Slice ends")
        axes, steps = body.ints(node, 3, "Slice axes"), body.ints(node, 4, "Slice steps")
    else:
        starts = [int(v) for v in attrs.get("starts", [])]  # type: ignore[union-attr]
        ends = [int(v) for v in attrs.get("ends", [])]  # type: ignore[union-attr]
        axes = [int(v) for v in attrs["axes"]] if attrs.get("axes") is not None else None  # type: ignore[union-attr]
        steps = None
    window = slice_window(shape, starts or [], ends or [], axes, steps) if starts and ends else None
    if window is None:
        raise Unsupported(f"Slice '{node.name}' is not a constant step-1 window")
    return window


def _epilogue(
    body: _Body, anchor: onnx.NodeProto, prologue: list[onnx.NodeProto]
) -> tuple[list[onnx.NodeProto], list[onnx.NodeProto], tuple[onnx.NodeProto, list[onnx.NodeProto]] | None]:
    """(epilogue ops before any output Transpose, the Transpose and the views after it, a
    closing LayerNormalization with the views after it)."""
    desc = body.descendants(anchor)
    norms = [n for n in desc if n.op_type == "LayerNormalization"]
    if len(norms) > 1:
        raise Unsupported(f"an anchor kernel closes with one LayerNormalization, not {len(norms)}")
    norm = norms[0] if norms else None
    norm_views: list[onnx.NodeProto] = []
    if norm is not None:
        norm_views = body.descendants(norm)
        for n in norm_views:
            if n.op_type not in EPILOGUE_VIEW_OPS:
                raise Unsupported(
                    f"{n.op_type} '{n.name}' after LayerNormalization '{norm.name}' "
                    "would need the normalised row"
                )
    known = {id(n) for n in (*desc, *prologue, anchor)}
    closing = {id(norm), *(id(n) for n in norm_views)}
    desc = [n for n in desc if id(n) not in closing]
    other = [n for n in body.nodes if id(n) not in known]
    if other:
        raise Unsupported(
            f"{other[0].op_type} '{other[0].name}' is neither a prologue nor an epilogue of {anchor.op_type}"
        )
    size = body.numel(anchor.output[0])
    transposes = [n for n in desc if n.op_type == "Transpose"]
    if transposes and anchor.op_type not in GEMM_OPS:
        first, op = transposes[0], anchor.op_type
        raise Unsupported(f"Transpose '{first.name}' after {op} '{anchor.name}' would need a copy")
    if len(transposes) > 1:
        raise Unsupported(
            f"{anchor.op_type} '{anchor.name}' can store through one output Transpose, not {len(transposes)}"
        )
    tail = transposes[0] if transposes else None
    after = {id(n) for n in body.descendants(tail)} if tail is not None else set()
    produced_before = {o for n in prologue for o in n.output if o}
    steps, tail_nodes = [], []
    for n in desc:
        if id(n) in after:
            if n.op_type not in EPILOGUE_VIEW_OPS:
                raise Unsupported(
                    f"{n.op_type} '{n.name}' after the output Transpose '{tail.name}' would need a copy"  # type: ignore[union-attr]
                )
            tail_nodes.append(n)
        elif n is tail:
            tail_nodes.append(n)
        elif n.op_type in EPILOGUE_VIEW_OPS:
            steps.append(n)
        else:
            opdef = lookup(n.op_type)
            if opdef.kind not in (OpKind.ELEMENTWISE, OpKind.BROADCAST) or opdef.scalar is None:
                raise Unsupported(f"{n.op_type} '{n.name}' cannot run as an epilogue of {anchor.op_type}")
            steps.append(n)
        if body.numel(n.output[0]) != size:
            raise Unsupported(f"epilogue {n.op_type} '{n.name}' changes the domain of {anchor.op_type}")
        if any(x in produced_before for x in n.input):
            raise Unsupported(f"epilogue {n.op_type} '{n.name}' reads a prologue value")
    return steps, tail_nodes, (norm, norm_views) if norm is not None else None


def _row_norm(
    body: _Body,
    anchor: onnx.NodeProto,
    norm: onnx.NodeProto,
    views: list[onnx.NodeProto],
    n: int,
    tail: OutputTail | None,
    domain: tuple[int, ...],
    split: int,
) -> RowNorm:
    """The LayerNormalization closing the epilogue, when each of its rows is one row of the
    product: over the last axis, of a value on the anchor's domain, with per-column scale and
    bias the kernel reads, and rows short enough for a tile of whole rows. Views after it keep
    the element order: the one of its values leaving the kernel is where the rows are stored.
    `n`: the product's columns."""
    what = f"LayerNormalization '{norm.name}'"
    if tail is not None:
        raise Unsupported(f"{what} cannot follow an output Transpose of {anchor.op_type} '{anchor.name}'")
    if len(norm.output) > 1 and any(norm.output[1:]):
        raise Unsupported(f"{what}: its Mean / InvStdDev outputs are not computed by an anchor kernel")
    x = norm.input[0]
    shape = body.shape(x)
    axis = int(attrs_of(norm).get("axis", -1))  # type: ignore[call-overload]
    if not shape or axis % len(shape) != len(shape) - 1:
        raise Unsupported(f"{what} normalises axis {axis}, not the last axis of {list(shape)}")
    if split != len(domain) - 1 or shape[-1] != n or body.numel(x) != math.prod(domain):
        raise Unsupported(
            f"{what} rows of {list(shape)} are not the rows of {anchor.op_type} '{anchor.name}'"
        )
    if n > ROW_NORM_MAX_COLUMNS:
        raise Unsupported(
            f"{what} over rows of {n} columns: a tile of whole rows would not stay in cache "
            f"(at most {ROW_NORM_MAX_COLUMNS} columns)"
        )
    params: list[str | None] = []
    for slot, role in ((1, "scale"), (2, "bias")):
        name = norm.input[slot] if len(norm.input) > slot and norm.input[slot] else None
        if name is not None:
            if name in body.producer:
                raise Unsupported(f"{what} {role} '{name}' is computed in the kernel, not read")
            pshape = body.shape(name)
            if math.prod(pshape) != n or (pshape and pshape[-1] != n):
                raise Unsupported(f"{what} {role} of shape {list(pshape)} is not one value per column")
        params.append(name)
    if params[0] is None:
        raise Unsupported(f"{what} has no scale")
    leaving = [o for m in (norm, *views) for o in m.output[:1] if o in body.outputs]
    if len(leaving) != 1:
        raise Unsupported(f"{len(leaving)} views of the output of {what} leave the kernel, not one")
    epsilon = float(attrs_of(norm).get("epsilon", 1e-5))  # type: ignore[arg-type]
    through = tuple(m.name for m in views)
    return RowNorm(norm.name, x, params[0], params[1], epsilon, leaving[0], n, through)


def _output_tail(body: _Body, anchor: onnx.NodeProto, nodes: list[onnx.NodeProto]) -> OutputTail:
    """The Transpose folded into the GEMM's stores: it must keep the last axis last and map the
    anchor's output, through the views around it, to a layout with unit-stride columns
    (attention's `[B,H,S,D] -> Transpose(0,2,1,3)`: ldc = H*D)."""
    tail = nodes[0]
    src = body.shape(tail.input[0])
    perm = [int(p) for p in (attrs_of(tail).get("perm") or reversed(range(len(src))))]  # type: ignore[call-overload]
    if not src or perm[-1] != len(src) - 1:
        raise Unsupported(f"Transpose '{tail.name}' moves the last axis of {anchor.op_type} '{anchor.name}'")
    if anchor.op_type == "MatMul" and any(len(body.shape(x)) < 2 for x in anchor.input[:2]):
        raise Unsupported(f"Transpose '{tail.name}' after a MatMul of a vector would need a copy")
    dense = dense_strides(body.shape(tail.output[0]))
    src_strides = [0] * len(src)
    for axis, p in enumerate(perm):
        src_strides[p] = dense[axis]
    y = body.shape(anchor.output[0])
    strides = reshape_strides(src, src_strides, y)
    if strides is None or not y or (y[-1] != 1 and strides[-1] != 1):
        raise Unsupported(
            f"Transpose '{tail.name}' does not keep the rows of {anchor.op_type} '{anchor.name}' contiguous"
        )
    leaving = [o for n in nodes for o in n.output if o in body.outputs]
    if len(leaving) != 1:
        raise Unsupported(
            f"{len(leaving)} views of the transposed output of '{anchor.name}' leave the kernel, not one"
        )
    return OutputTail(tail.input[0], leaving[0], tuple(strides), tuple(n.name for n in nodes))


def _float_boundary(body: _Body, float_types: Collection[int]) -> None:
    """Anchor kernels take and give `float_types` only (small integer constants are inlined, not
    passed)."""
    for t in (*body.spec.inputs, *body.spec.outputs):
        if t.elem_type in float_types:
            continue
        if t.name in body.constants and t.numel <= INLINED_INT_CONSTANT and t not in body.spec.outputs:
            continue
        name = onnx.TensorProto.DataType.Name(t.elem_type)
        allowed = "/".join(onnx.TensorProto.DataType.Name(e) for e in sorted(float_types))
        raise Unsupported(
            f"{t.name!r} crosses an anchor kernel's boundary as {name}; anchor kernels take {allowed}"
        )


# -- contractions -----------------------------------------------------------------------------------


def _matrix(v: OperandView, rows: int, cols: int, rs: int, cs: int, batch: Sequence[int]) -> MatrixView:
    return MatrixView(v.tensor, v.offset, rows, cols, rs, cs, tuple(batch))


def _gemm(anchor: onnx.NodeProto, ops: tuple[OperandView, ...], tail: OutputTail | None) -> Contraction:
    """ONNX Gemm: alpha and the transposes (C and beta are the addend)."""
    attrs = attrs_of(anchor)
    a, b = ops[0], ops[1]
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise Unsupported("Gemm operands must be 2-D")
    (ar, ac), (ars, acs) = a.shape, a.strides
    if attrs.get("transA", 0):
        ar, ac, ars, acs = ac, ar, acs, ars
    (br, bc), (brs, bcs) = b.shape, b.strides
    if attrs.get("transB", 0):
        br, bc, brs, bcs = bc, br, bcs, brs
    if ac != br:
        raise Unsupported(f"Gemm inner dimensions differ: {list(a.shape)} x {list(b.shape)}")
    ldc = max(1, bc)
    if tail is not None:
        if bc != 1 and tail.strides[-1] != 1:
            raise Unsupported("a permuted Gemm output must keep its columns contiguous")
        ldc = tail.strides[0] if ar > 1 else max(1, bc)
        if ldc < bc:
            raise Unsupported(f"output rows {ldc} apart overlap rows of {bc} columns")
    alpha = float(attrs.get("alpha", 1.0))  # type: ignore[arg-type]
    return Contraction(
        (), ar, bc, ac, _matrix(a, ar, ac, ars, acs, ()), _matrix(b, br, bc, brs, bcs, ()), alpha, ldc, ()
    )


def _addend(body: _Body, anchor: onnx.NodeProto, c: Contraction) -> Addend | None:
    beta = float(attrs_of(anchor).get("beta", 1.0))  # type: ignore[arg-type]
    if len(anchor.input) < 3 or not anchor.input[2] or beta == 0.0:
        return None
    shape = body.shape(anchor.input[2])
    if len(shape) > 2 or any(d not in (1, full) for d, full in zip(shape[::-1], (c.n, c.m), strict=False)):
        raise Unsupported(f"Gemm C of shape {list(shape)} does not broadcast to {[c.m, c.n]}")
    return Addend(anchor.input[2], beta, shape)


def _batch_part(v: OperandView, nd: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    pad = nd - (len(v.shape) - 2)
    return (1,) * pad + tuple(v.shape[:-2]), (0,) * pad + tuple(v.strides[:-2])


def _matmul(ops: tuple[OperandView, ...], tail: OutputTail | None) -> Contraction:
    """MatMul with numpy semantics (vectors, broadcast batch dims). Trailing batch dims B shares
    fold into M where the rows of A and of the output stay evenly spaced."""
    a, b = ops[0], ops[1]
    a_vec, b_vec = len(a.shape) == 1, len(b.shape) == 1
    if tail is not None and (a_vec or b_vec):
        raise Unsupported("a permuted output needs a MatMul of matrices, not of a vector")
    if a_vec:
        a = OperandView(a.tensor, (1, a.shape[0]), (a.shape[0] * a.strides[0], a.strides[0]), a.offset)
    if b_vec:
        b = OperandView(b.tensor, (b.shape[0], 1), (b.strides[0], 1), b.offset)
    m, k = a.shape[-2:]
    k2, n = b.shape[-2:]
    if k != k2:
        raise Unsupported(f"MatMul inner dimensions differ: {list(a.shape)} x {list(b.shape)}")
    nd = max(len(a.shape), len(b.shape)) - 2
    a_dims, a_str = _batch_part(a, nd)
    b_dims, b_str = _batch_part(b, nd)
    full = tuple(max(da, db) for da, db in zip(a_dims, b_dims, strict=True))
    c_str = tail.strides if tail is not None else dense_strides((*full, m, n))
    if len(c_str) != nd + 2 or (n != 1 and c_str[-1] != 1):
        raise Unsupported(f"output strides {list(c_str)} do not keep MatMul columns contiguous")
    batch, sa, sb, sc = [], [], [], []
    for da, db, ta, tb, tc in zip(a_dims, b_dims, a_str, b_str, c_str[:-2], strict=True):
        if da != db and 1 not in (da, db):
            raise Unsupported(f"MatMul batch dims do not broadcast: {list(a.shape)} x {list(b.shape)}")
        d = max(da, db)
        if d == 1:
            continue
        batch.append(d)
        sa.append(ta if da != 1 else 0)
        sb.append(tb if db != 1 else 0)
        sc.append(tc)
    a_rs, a_cs = a.strides[-2:]
    c_rs = c_str[-2]
    while batch and sb[-1] == 0 and (m == 1 or (sa[-1] == m * a_rs and sc[-1] == m * c_rs)):
        if m == 1:
            a_rs, c_rs = sa[-1], sc[-1]
        m *= batch.pop()
        sa.pop()
        sb.pop()
        sc.pop()
    ldc = c_rs if m > 1 else max(1, n)
    if ldc < n:
        raise Unsupported(f"output rows {ldc} apart overlap rows of {n} columns")
    return Contraction(
        tuple(batch),
        m,
        n,
        k,
        _matrix(a, m, k, a_rs, a_cs, sa),
        _matrix(b, k, n, b.strides[-2], b.strides[-1], sb),
        1.0,
        ldc,
        tuple(sc),
    )


# -- chains -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChainMatch:
    """Two contractions in one kernel, `first` -> `middle` -> `second` -> `epilogue`, the
    intermediate never leaving the thread's cache: two GEMMs per block of rows, or a 1x1 Conv
    feeding a depthwise 3x3 Conv (an inverted-residual block's expansion and depthwise conv) per
    band of output rows (`conv`).

    For GEMMs `middle` holds the elementwise ops and views from the first product to the second's
    left operand; a view among them keeps the rows (a row of the first product is a row of the
    second's left operand), so the chain runs on blocks of rows. For convs it is at most one Relu
    or Clip of constant bounds: the library applies it, with the first conv's bias, to the
    expansion as it computes it (lower/conv_chain.py)."""

    first: onnx.NodeProto
    second: onnx.NodeProto
    middle: tuple[onnx.NodeProto, ...]
    epilogue: tuple[onnx.NodeProto, ...]

    @property
    def conv(self) -> bool:
        """Whether this is a conv chain (a 1x1 Conv and a depthwise 3x3 Conv, either first)."""
        return self.first.op_type == "Conv"

    @property
    def depthwise_first(self) -> bool:
        """Whether a conv chain's depthwise conv feeds its 1x1 conv (else the other way round)."""
        return self.conv and int(attrs_of(self.first).get("group", 1)) > 1  # type: ignore[arg-type]

    def to_json(self, node: Callable[[str], str] = str) -> dict[str, object]:
        return {
            "kind": "anchor_chain",
            "first": node(self.first.name),
            "second": node(self.second.name),
            "middle": [node(n.name) for n in self.middle],
            "epilogue": [node(n.name) for n in self.epilogue],
        }


def _elementwise_or_view(n: onnx.NodeProto) -> bool:
    opdef = lookup(n.op_type)
    return n.op_type in EPILOGUE_VIEW_OPS or opdef.kind in (OpKind.ELEMENTWISE, OpKind.BROADCAST)


def match_chain(spec: KernelSpec) -> ChainMatch:
    """The two-GEMM chain `spec` forms; raises `Unsupported` saying why it forms none."""
    body = _Body(spec)
    anchors = [n for n in body.nodes if n.op_type in ANCHOR_OPS]
    if len(anchors) != 2:
        raise Unsupported(f"an anchor chain has two anchors, found {len(anchors)}")
    first, second = anchors
    if first.op_type == "Conv" and second.op_type == "Conv":
        return _conv_chain(body, first, second)
    if first.op_type not in GEMM_OPS or second.op_type not in GEMM_OPS:
        raise Unsupported(
            "only MatMul/Gemm pairs, or a 1x1 Conv feeding a depthwise 3x3 Conv, share a kernel"
        )
    node = body.producer.get(second.input[0])
    while node is not None and node is not first:
        node = body.producer.get(node.input[0])
    if node is not first:
        raise Unsupported("the second contraction does not consume the first")
    # Every node on a path from the first product to the second's left operand, side branches
    # included (GELU's `x * 0.5 * (1 + erf(x / sqrt 2))` reads x three times).
    after_first = {id(n) for n in body.descendants(first)}
    middle = [n for n in body.ancestors(second) if id(n) in after_first]
    for n in middle:
        if not (_elementwise_or_view(n) or lookup(n.op_type).kind == OpKind.VIEW):
            raise Unsupported(f"{n.op_type} between the two contractions is not elementwise")
    y1 = first.output[0]
    n1 = (body.shape(y1) or (0,))[-1]
    k2 = (body.shape(second.input[0]) or (0,))[-1]
    rows1, rows2 = body.numel(y1) // max(n1, 1), body.numel(second.input[0]) // max(k2, 1)
    if n1 != k2 or rows1 != rows2:
        raise Unsupported("the reshape between the contractions does not keep rows")
    for n in (first, *middle):
        if any(o in body.outputs for o in n.output if o):
            raise Unsupported("the intermediate of a contraction chain is read outside the kernel")
    for n in middle:
        if lookup(n.op_type).kind != OpKind.VIEW and body.numel(n.output[0]) != body.numel(y1):
            raise Unsupported("the first contraction's epilogue changes its domain")
    desc = _chain_epilogue(body, first, middle, second, _chain_norm)
    return ChainMatch(first, second, tuple(middle), tuple(desc))


def _chain_epilogue(
    body: _Body,
    first: onnx.NodeProto,
    middle: Sequence[onnx.NodeProto],
    second: onnx.NodeProto,
    closing_norm: Callable[[_Body, onnx.NodeProto, list[onnx.NodeProto]], set[int]] | None = None,
) -> list[onnx.NodeProto]:
    """The second contraction's epilogue: every node after it, elementwise or a view on its
    domain (`closing_norm`: the ids of a closing LayerNormalization the chain may take); raises
    `Unsupported` for a node that is neither in the chain nor after it."""
    chained = {id(n) for n in (first, *middle)}
    desc = body.descendants(second)
    other = [n for n in body.nodes if id(n) not in chained and n is not second and n not in desc]
    if other:
        raise Unsupported(
            f"{other[0].op_type} '{other[0].name}' is neither a prologue nor an epilogue of {second.op_type}"
        )
    size = body.numel(second.output[0])
    before = {o for n in (first, *middle) for o in n.output if o}
    closing = closing_norm(body, second, desc) if closing_norm else set()
    for n in desc:
        if id(n) not in closing and not _elementwise_or_view(n):
            raise Unsupported(f"{n.op_type} '{n.name}' cannot run as an epilogue of {second.op_type}")
        if body.numel(n.output[0]) != size:
            raise Unsupported(f"epilogue {n.op_type} '{n.name}' changes the domain of {second.op_type}")
        if any(x in before for x in n.input):
            raise Unsupported(f"epilogue {n.op_type} '{n.name}' reads a prologue value")
    return desc


def _conv_attrs(node: onnx.NodeProto, body: _Body) -> tuple[int, list[int], list[int], list[int]]:
    """(group, strides, pads, dilations) of a 2-D Conv with explicit pads (auto_pad NOTSET)."""
    attrs = attrs_of(node)
    auto_pad = attrs.get("auto_pad", b"NOTSET")
    if (auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad) != "NOTSET":
        raise Unsupported(f"Conv '{node.name}' of a chain pads by auto_pad")
    if len(body.shape(node.input[0])) != 4:
        raise Unsupported(f"Conv '{node.name}' of a chain is not 2-D")
    group = int(attrs.get("group", 1))  # type: ignore[arg-type]
    strides = [int(v) for v in attrs.get("strides", [1, 1])]  # type: ignore[union-attr]
    pads = [int(v) for v in attrs.get("pads", [0, 0, 0, 0])]  # type: ignore[union-attr]
    dilations = [int(v) for v in attrs.get("dilations", [1, 1])]  # type: ignore[union-attr]
    return group, strides, pads, dilations


def clip_bounds(node: onnx.NodeProto, constants: Mapping[str, np.ndarray]) -> tuple[float, float] | None:
    """A Clip's (min, max) when both are compile-time scalars (inputs from opset 11, attributes
    before), else None."""
    attrs = attrs_of(node)
    bounds: list[float] = []
    for k, key in ((1, "min"), (2, "max")):
        name = node.input[k] if len(node.input) > k else ""
        if name:
            value = constants.get(name)
            if value is None or value.size != 1:
                return None
            bounds.append(float(np.asarray(value).reshape(())))
        elif key in attrs:
            bounds.append(float(attrs[key]))  # type: ignore[arg-type]
        else:
            return None
    return bounds[0], bounds[1]


def _activation_bounds(node: onnx.NodeProto, body: _Body) -> bool:
    """Whether a chain's middle node is one the library applies: Relu, or Clip of scalar
    constant (or attribute) bounds."""
    if node.op_type == "Clip":
        return clip_bounds(node, body.constants) is not None
    return node.op_type == "Relu"


def _pointwise_conv(node: onnx.NodeProto, body: _Body) -> bool:
    """A 1x1 Conv of stride 1, unpadded, undilated, one group."""
    group, strides, pads, dilations = _conv_attrs(node, body)
    kernel = tuple(body.shape(node.input[1])[2:])
    return group == 1 and strides == [1, 1] and not any(pads) and dilations == [1, 1] and kernel == (1, 1)


def _depthwise_conv(node: onnx.NodeProto, body: _Body) -> bool:
    """A depthwise 3x3 Conv (a channel a group) of stride 1 or 2, undilated, one pixel of padding
    on each side."""
    group, strides, pads, dilations = _conv_attrs(node, body)
    channels = body.shape(node.input[0])[1]
    return (
        group == channels
        and tuple(body.shape(node.input[1])) == (channels, 1, 3, 3)
        and strides in ([1, 1], [2, 2])
        and pads == [1, 1, 1, 1]
        and dilations == [1, 1]
    )


def _conv_chain(body: _Body, first: onnx.NodeProto, second: onnx.NodeProto) -> ChainMatch:
    """A 1x1 Conv (`_pointwise_conv`) whose output, through at most one Relu or Clip, only feeds a
    depthwise 3x3 Conv (`_depthwise_conv`), or a depthwise 3x3 Conv feeding a 1x1 Conv so, then
    the second conv's elementwise epilogue."""
    if _pointwise_conv(first, body):
        if not _depthwise_conv(second, body):
            raise Unsupported(
                f"Conv '{second.name}' after a 1x1 conv is not a depthwise 3x3 of stride 1 or 2"
            )
    elif not _depthwise_conv(first, body):
        raise Unsupported(
            f"Conv '{first.name}' opening a conv chain is neither a 1x1 conv nor a depthwise 3x3"
        )
    elif not _pointwise_conv(second, body):
        raise Unsupported(f"Conv '{second.name}' after a depthwise conv is not a 1x1 conv of stride 1")
    middle: list[onnx.NodeProto] = []
    value = first.output[0]
    while value != second.input[0]:
        users = body.consumers.get(value, [])
        if len(users) != 1 or value in body.outputs:
            raise Unsupported("the intermediate of a conv chain is read outside the chain")
        node = users[0]
        if middle or not _activation_bounds(node, body) or node.input[0] != value:
            raise Unsupported(f"{node.op_type} '{node.name}' between the convs is not one Relu or Clip")
        middle.append(node)
        value = node.output[0]
    if len(body.consumers.get(value, [])) != 1 or value in body.outputs:
        raise Unsupported("the intermediate of a conv chain is read outside the chain")
    between = 4 * body.numel(first.output[0])
    if between < CONV_CHAIN_MIN_BYTES:
        raise Unsupported(
            f"the tensor between the convs ({between} bytes) stays in cache between two kernels: "
            f"a conv chain gains from {CONV_CHAIN_MIN_BYTES} bytes on"
        )
    desc = _chain_epilogue(body, first, middle, second)
    return ChainMatch(first, second, tuple(middle), tuple(desc))


def _chain_norm(body: _Body, second: onnx.NodeProto, desc: list[onnx.NodeProto]) -> set[int]:
    """The ids of a LayerNormalization closing a chain's epilogue and of the views after it,
    checked as a single anchor's (`_row_norm`: a chain computes whole rows of its second
    product, so the rows are there to normalise); empty when there is none."""
    norms = [n for n in desc if n.op_type == "LayerNormalization"]
    if not norms:
        return set()
    if len(norms) > 1:
        raise Unsupported(f"an anchor chain closes with one LayerNormalization, not {len(norms)}")
    views = body.descendants(norms[0])
    for v in views:
        if v.op_type not in EPILOGUE_VIEW_OPS:
            raise Unsupported(
                f"{v.op_type} '{v.name}' after LayerNormalization '{norms[0].name}' "
                "would need the normalised row"
            )
    domain = body.shape(second.output[0])
    if len(domain) < 2:
        raise Unsupported(f"{second.op_type} '{second.name}' has no rows to normalise")
    _row_norm(body, second, norms[0], views, domain[-1], None, domain, len(domain) - 1)
    return {id(norms[0]), *(id(v) for v in views)}
