"""Operands and fused epilogues of anchor kernels (Conv, ConvTranspose, MatMul, Gemm).

An anchor writes its contraction result one *tile* at a time: a block of rows of the output seen
as a matrix `[R, L]` (`L` = the product of the trailing output dims a tile spans whole or in part,
e.g. `N` for a GEMM, `OH*OW` for an NCHW conv). The epilogue (bias, activation, residual add,
scaling, affine batch norm ...) is emitted as a `static` C function over one such tile and called
right after the BLAS call that produced it, while the tile is still in L1/L2: a second pass over
the full output would cost a whole extra round trip to memory (measured at 2x, DESIGN.md §1).

Views (Reshape, Flatten, Squeeze, Unsqueeze, Identity) may sit between epilogue ops: they do not
move data, so every epilogue value is still indexed by the tile element's *linear* index
`r * L + c`; a view only renames the value. Each operand is addressed by numpy broadcasting
against the shape of the value its op produces (its *index space*: the anchor's output shape
before any view, the view's shape after one), so a bias added after `[B*S, N] -> [B, S, N]`
broadcasts as ONNX says. Per operand the generator splits that index space into a row part (a
function of `r`, hoisted out of the inner loop) and a column part spanning the `L` elements of a
tile row, splitting one axis when the row boundary falls inside it; the inner loop then reads each
operand as a constant, a per-row scalar or a unit-stride run, and the compiler vectorizes it. An
operand that broadcasts inside the column block (rare) pays for an index division per element,
and one whose index space admits no row split (a view that cuts across tile rows) pays for the
full index arithmetic on the linear index.

`Operands` resolves tensor names to C: kernel parameters (`args[i]`), scalar constants baked in
as literals, small constant arrays emitted as `static const` data.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import onnx

from ....kernel_ir import DType
from ....kernel_ir import nodes as ir
from ....ops import OpKind, lookup
from ..kernel_spec import KernelSpec
from ..render_c import c_type, render_inline
from .common import CodegenUnsupported, attrs_of, c_literal, vector_math_functions


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major element strides of a dense tensor."""
    out = [1] * len(shape)
    for a in range(len(shape) - 2, -1, -1):
        out[a] = out[a + 1] * int(shape[a + 1])
    return tuple(out)


def constant_of_node(node: onnx.NodeProto) -> np.ndarray:
    """The value of a `Constant` node (the forms a folded scalar can take)."""
    for attr in node.attribute:
        value = onnx.helper.get_attribute_value(attr)
        if attr.name == "value":
            return onnx.numpy_helper.to_array(value)
        if attr.name in ("value_float", "value_floats"):
            return np.asarray(value, dtype=np.float32)
        if attr.name in ("value_int", "value_ints"):
            return np.asarray(value, dtype=np.int64)
    raise CodegenUnsupported(f"Constant node {node.name!r} has no value this backend reads")


class Operands:
    """Tensor names of one kernel resolved to C expressions.

    Scalars known at compile time become literals (so `Mul(x, 0.5)` costs one multiply); other
    constants that are not kernel parameters become `static const` arrays named after the kernel
    symbol, so several kernels can share one translation unit.
    """

    def __init__(self, spec: KernelSpec) -> None:
        self.spec = spec
        self.args: dict[str, int] = {}
        for k, t in enumerate((*spec.inputs, *spec.outputs)):
            self.args.setdefault(t.name, k)
        self.outputs = frozenset(t.name for t in spec.outputs)
        self.constants: dict[str, np.ndarray] = {k: np.asarray(v) for k, v in spec.constants.items()}
        for node in spec.nodes:
            if node.op_type == "Constant":
                self.constants[node.output[0]] = constant_of_node(node)
        self.shapes: dict[str, tuple[int, ...]] = {n: tuple(t.shape) for n, t in spec.tensors.items()}
        self.elem_types: dict[str, int] = {n: t.elem_type for n, t in spec.tensors.items()}
        self.decls: list[str] = []
        self._arrays: dict[str, str] = {}
        self._counter = 0

    def fresh(self, stem: str) -> str:
        """A file-unique C identifier (prefixed with the kernel symbol)."""
        self._counter += 1
        return f"{self.spec.symbol}_{stem}{self._counter}"

    def shape(self, name: str) -> tuple[int, ...]:
        if name in self.shapes:
            return self.shapes[name]
        if name in self.constants:
            return tuple(self.constants[name].shape)
        raise CodegenUnsupported(f"no shape known for tensor {name!r}")

    def elem_type(self, name: str) -> int:
        if name in self.elem_types:
            return self.elem_types[name]
        if name in self.constants:
            return onnx.helper.np_dtype_to_tensor_dtype(self.constants[name].dtype)
        return onnx.TensorProto.FLOAT

    def add_constant(self, stem: str, value: np.ndarray | float) -> str:
        """Register a compile-time value the generator invents (Gemm's beta, ...)."""
        name = f"__af_{stem}_{len(self.constants)}"
        arr = np.asarray(value, dtype=np.float32)
        self.constants[name] = arr
        self.shapes[name] = tuple(arr.shape)
        self.elem_types[name] = onnx.TensorProto.FLOAT
        return name

    def scalar(self, name: str) -> str | None:
        """A C literal when `name` is a one-element compile-time constant, else None."""
        value = self.constants.get(name)
        if value is None or value.size != 1:
            return None
        return c_literal(value.reshape(-1)[0], self.elem_type(name))

    def pointer(self, name: str) -> str:
        """A `const T *` C expression addressing the tensor's dense buffer."""
        ctype = _ctype(self.elem_type(name))
        if name in self.args:
            return f"((const {ctype} *)args[{self.args[name]}])"
        if name in self.constants:
            if name not in self._arrays:
                values = self.constants[name].reshape(-1)
                cname = self.fresh("k")
                body = ", ".join(c_literal(v, self.elem_type(name)) for v in values)
                self.decls.append(f"static const {ctype} {cname}[{max(values.size, 1)}] = {{{body or '0'}}};")
                self._arrays[name] = cname
            return self._arrays[name]
        raise CodegenUnsupported(f"tensor {name!r} is neither a kernel parameter nor a constant")

    def output_pointer(self, name: str) -> str:
        if name not in self.outputs:
            raise CodegenUnsupported(f"tensor {name!r} is not a kernel output")
        return f"((float *)args[{self.args[name]}])"


def _ctype(elem_type: int) -> str:
    return c_type(DType.from_onnx(elem_type))


# Views an epilogue may contain: they alias their input (the same linear index, a new shape).
EPILOGUE_VIEWS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"})


@dataclass(frozen=True)
class Step:
    """One scalar op of an epilogue: `output = op(inputs)` evaluated per element."""

    op_type: str
    inputs: tuple[str, ...]
    output: str
    attrs: dict[str, object] = field(default_factory=dict, hash=False, compare=False)

    @staticmethod
    def of(node: onnx.NodeProto) -> Step:
        if node.op_type in EPILOGUE_VIEWS:
            return Step(node.op_type, (node.input[0],), node.output[0])  # shape/axes: compile time
        return Step(node.op_type, tuple(node.input), node.output[0], attrs_of(node))

    @property
    def is_view(self) -> bool:
        return self.op_type in EPILOGUE_VIEWS


@dataclass
class Epilogue:
    """Elementwise ops applied to an anchor's output, over the domain `domain`.

    `source` names the raw contraction result (what the BLAS call leaves in the tile); every
    other value is a step output. `split` is how many leading domain dims make up the tile's row
    index (the rest make up the column index). `spaces[step.output]` is the index space the
    step's operands broadcast against (its output shape, or the domain for a step on a smaller
    operand such as Gemm's `beta * C`).
    """

    source: str
    domain: tuple[int, ...]
    split: int
    steps: list[Step] = field(default_factory=list)
    shape_overrides: dict[str, tuple[int, ...]] = field(default_factory=dict)
    spaces: dict[str, tuple[int, ...]] = field(default_factory=dict)

    @property
    def values(self) -> list[str]:
        return [self.source, *(s.output for s in self.steps)]

    @property
    def row_len(self) -> int:
        return math.prod(self.domain[self.split :])

    def describe(self) -> str:
        return " -> ".join(s.op_type for s in self.steps) or "none"

    def root(self, name: str) -> str:
        """The value `name` views (itself unless a view step produced it)."""
        views = {s.output: s.inputs[0] for s in self.steps if s.is_view}
        while name in views:
            name = views[name]
        return name


def check_step(step: Step) -> None:
    """Only scalar ops with a C expression may sit in an anchor's epilogue."""
    if step.is_view:
        return
    opdef = lookup(step.op_type)
    if opdef.kind not in (OpKind.ELEMENTWISE, OpKind.BROADCAST) or opdef.scalar is None:
        raise CodegenUnsupported(f"{step.op_type} cannot be applied as an anchor epilogue")


def _broadcast_strides(shape: Sequence[int], domain: Sequence[int]) -> tuple[int, ...]:
    """Element strides of a dense tensor of `shape` read at domain indices (0 where broadcast)."""
    if len(shape) > len(domain):
        extra = shape[: len(shape) - len(domain)]
        if any(int(d) != 1 for d in extra):
            raise CodegenUnsupported(f"operand {tuple(shape)} does not broadcast to {tuple(domain)}")
        shape = shape[len(shape) - len(domain) :]
    padded = (1,) * (len(domain) - len(shape)) + tuple(int(d) for d in shape)
    dense = contiguous_strides(padded)
    out = []
    for d, full, s in zip(padded, domain, dense, strict=True):
        if d == full:
            out.append(s if d != 1 else 0)
        elif d == 1:
            out.append(0)
        else:
            raise CodegenUnsupported(f"operand {tuple(shape)} does not broadcast to {tuple(domain)}")
    return tuple(out)


def _div_mod(var: str, inner: int, dim: int, outermost: bool) -> str:
    expr = var if inner == 1 else f"({var} / {inner})"
    return expr if outermost else f"({expr} % {dim})"


def _offset_expr(var: str, dims: Sequence[int], strides: Sequence[int]) -> str:
    """Offset `sum(index_d * stride_d)` where `var` is the row-major linear index over `dims`."""
    terms = []
    inner = 1
    inners = []
    for d in reversed(dims):
        inners.append(inner)
        inner *= int(d)
    inners.reverse()
    for a, (d, s) in enumerate(zip(dims, strides, strict=True)):
        if s == 0 or int(d) == 1:
            continue
        idx = _div_mod(var, inners[a], int(d), outermost=all(int(x) == 1 for x in dims[:a]) or a == 0)
        terms.append(idx if s == 1 else f"{idx} * {s}")
    return " + ".join(terms) if terms else "0"


Layout = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]


def split_rows(dims: Sequence[int], strides: Sequence[int], row_len: int) -> Layout | None:
    """(row dims, row strides, column dims, column strides) of an index space whose linear index
    is `r * row_len + c`: the column part spans exactly `row_len` elements.

    When the boundary falls inside an axis, that axis is split in two (always a pure relabelling:
    `d -> (d / q, q)` with strides `(s * q, s)`); None when `row_len` does not divide that way
    (e.g. rows of 10 over an index space `[5, 6]`)."""
    dims = tuple(int(d) for d in dims)
    strides = tuple(int(s) for s in strides)
    if row_len <= 0 or math.prod(dims) % row_len:
        return None
    inner = 1
    for a in range(len(dims) - 1, -1, -1):
        if inner == row_len:
            return dims[: a + 1], strides[: a + 1], dims[a + 1 :], strides[a + 1 :]
        d = dims[a]
        if inner * d > row_len:
            q = row_len // inner
            if row_len % inner or d % q:
                return None
            return (
                (*dims[:a], d // q),
                (*strides[:a], strides[a] * q),
                (q, *dims[a + 1 :]),
                (strides[a], *strides[a + 1 :]),
            )
        inner *= d
    return ((), (), dims, strides) if inner == row_len else None


# erf for float as x * P(x^2) / Q(x^2), evaluated in double: at most 0.82 ulp from the exact erf
# over [-6, 6] (glibc's erff: 0.5 ulp), but unlike a scalar libm call it inlines and vectorizes
# (measured on BERT's 128x3072 FFN tile: 13.3 ms -> 7.9 ms against scalar erff). Coefficients:
# our own rational least-squares fit, refined toward minimax (Lawson); beyond |x| = 3.925 erf is
# 1.0f. NaN passes through the comparisons. It is the fallback: where glibc's vector erff links
# (`epilogue_erf()`), that one is used instead, as in the pointwise kernels, since it is about
# twice as fast (8 float lanes instead of 4 double lanes and no double division: 0.29 vs 0.55 ms
# over 393K elements, 2 ulp vs 1 ulp from the exact erf).
ERF_PRELUDE = """\
#ifndef AF_ERFF
#define AF_ERFF
static inline float af_erff(float v) {
  const double x = v < -3.925f ? -3.925 : (v > 3.925f ? 3.925 : (double)v);
  const double t = x * x;
  const double p = ((((2.046129082067539e-06 * t + 0.00028484504835248417) * t + 0.0037723890765092014) * t
                     + 0.05276881692238022) * t + 0.19058931879321042) * t + 1.1283791457563952;
  const double q = ((((3.8048906555188176e-05 * t + 0.0011638283190380002) * t + 0.014982870685050121) * t
                     + 0.1141809838567392) * t + 0.5022381165589217) * t + 1.0;
  return (float)(x * p / q);
}
#endif
"""


@lru_cache(maxsize=1)
def epilogue_erf() -> str:
    """The C function an epilogue's Erf calls: glibc's `erff` where its SIMD variant is declared
    (`common.vector_math_functions`) and linked (`compiler.simd_math_preamble`), so the loop
    vectorizes through libmvec; else the inline rational `af_erff` above, which vectorizes anywhere.
    """
    from ..compiler import simd_math_preamble  # late: the compiler module is heavier than codegen

    if "erff" in vector_math_functions() and simd_math_preamble():
        return "erff"
    return "af_erff"


def emit_epilogue(
    fn_name: str,
    epi: Epilogue,
    ops: Operands,
    *,
    write_back: str | None,
    flat_outputs: Sequence[str],
) -> str:
    """A `static` C function applying `epi` to one tile.

    Signature: `fn(args, tile, ldt, r0, r1, c0, c1)`; element (r, c) of the domain seen as
    `[R, L]` lives at `tile[(r - r0) * ldt + (c - c0)]` and holds the raw contraction result.
    `write_back` (a value name) is stored back into the tile; each of `flat_outputs` is stored at
    `out[r * L + c]` of its kernel output buffer.
    """
    domain = epi.domain
    row_dims, col_dims = domain[: epi.split], domain[epi.split :]
    row_len = epi.row_len

    head: list[str] = []
    per_row: list[str] = []
    refs: dict[tuple[str, tuple[int, ...]], str] = {}  # (operand, index space) -> C expression
    body: list[str] = []
    local: dict[str, str] = {epi.source: "x"}
    counter = 0

    def operand(name: str, space: tuple[int, ...]) -> str:
        nonlocal counter
        if name in local:
            return local[name]
        if (name, space) in refs:
            return refs[(name, space)]
        literal = ops.scalar(name)
        if literal is not None:
            refs[(name, space)] = literal
            return literal
        shape = epi.shape_overrides.get(name, ops.shape(name))
        strides = _broadcast_strides(shape, space)
        counter += 1
        ptr = f"e{counter}"
        ctype = _ctype(ops.elem_type(name))
        head.append(f"  const {ctype} *restrict {ptr} = {ops.pointer(name)};")
        refs[(name, space)] = _operand_ref(ptr, ctype, space, strides, row_len, head, per_row)
        return refs[(name, space)]

    loaded: dict[str, str] = {}

    def load(name: str, space: tuple[int, ...]) -> str:
        # Every operand read becomes a plain load into a local before the formula uses it, so a
        # select never holds a load in one branch: gcc 12.2 at -O3 -march=x86-64-v3 vectorizes
        # `m[c] ? a[c] : x` (m a uint8 table) into masked loads that yield 0 for some lanes.
        ref = operand(name, space)
        if not ref.endswith("]"):
            return ref
        if ref not in loaded:
            loaded[ref] = f"l{len(loaded)}"
            body.append(f"      const {_ctype(ops.elem_type(name))} {loaded[ref]} = {ref};")
        return loaded[ref]

    for k, step in enumerate(epi.steps):
        check_step(step)
        if step.is_view:
            if step.inputs[0] not in local:
                raise CodegenUnsupported(f"{step.op_type} of {step.inputs[0]!r} is not a view of the product")
            local[step.output] = local[step.inputs[0]]
            continue
        space = epi.spaces.get(step.output, domain)
        args = [ir.raw(load(n, space), DType.F32) if n else None for n in step.inputs]
        formula = lookup(step.op_type).scalar(args, step.attrs)  # type: ignore[misc]
        if formula.dtype is not DType.F32:  # the tile is fp32: an epilogue step must stay fp32
            raise CodegenUnsupported(f"{step.op_type} yields {formula.dtype.value} in an fp32 epilogue")
        expr = render_inline(formula)
        if epilogue_erf() != "erff":
            expr = expr.replace("erff(", f"{epilogue_erf()}(")
        var = f"v{k}"
        body.append(f"      const float {var} = {expr};")
        local[step.output] = var

    stores: list[str] = []
    if write_back is not None and local[write_back] != "x":
        stores.append(f"      t[c - c0] = {local[write_back]};")
    for j, name in enumerate(flat_outputs):
        head.append(f"  float *restrict o{j} = {ops.output_pointer(name)};")
        per_row.append(f"    float *restrict o{j}r = o{j} + r * {row_len}L;")
        stores.append(f"      o{j}r[c] = {local[name]};")

    lines = [
        f"/* epilogue: {epi.describe()} over {list(domain)}"
        f" (rows {list(row_dims)}, columns {list(col_dims)}) */",
        f"static void {fn_name}(void *const *args, float *restrict tile, long ldt, long r0, long r1, "
        "long c0, long c1) {",
        "  (void)args;",
        *head,
        "  for (long r = r0; r < r1; ++r) {",
        "    float *restrict t = tile + (r - r0) * ldt;",
        *per_row,
        "    for (long c = c0; c < c1; ++c) {",
        "      const float x = t[c - c0];",
        *body,
        *stores,
        "    }",
        "  }",
        "}",
    ]
    return "\n".join(lines)


def _operand_ref(
    ptr: str,
    ctype: str,
    space: tuple[int, ...],
    strides: tuple[int, ...],
    row_len: int,
    head: list[str],
    per_row: list[str],
) -> str:
    """The inner-loop C expression reading an operand with `strides` over the index space `space`
    (hoisted declarations go to `head` and `per_row`), fastest form first."""
    if not any(strides):
        head.append(f"  const {ctype} {ptr}s = {ptr}[0];")
        return f"{ptr}s"
    if strides == tuple(0 if d == 1 else s for d, s in zip(space, contiguous_strides(space), strict=True)):
        # The operand has the value's full shape: it is read at the linear index itself.
        per_row.append(f"    const {ctype} *restrict {ptr}r = {ptr} + r * {row_len}L;")
        return f"{ptr}r[c]"
    layout = split_rows(space, strides, row_len)
    if layout is None:
        return f"{ptr}[{_offset_expr(f'(r * {row_len}L + c)', space, strides)}]"
    row_dims, row_strides, col_dims, col_strides = layout
    row_off = _offset_expr("r", row_dims, row_strides)
    if not any(col_strides):
        per_row.append(f"    const {ctype} {ptr}s = {ptr}[{row_off}];")
        return f"{ptr}s"
    per_row.append(f"    const {ctype} *restrict {ptr}r = {ptr} + {row_off};")
    col_dense = contiguous_strides(col_dims)
    if col_strides == tuple(0 if d == 1 else s for d, s in zip(col_dims, col_dense, strict=True)):
        return f"{ptr}r[c]"
    return f"{ptr}r[{_offset_expr('c', col_dims, col_strides)}]"


def plan_destination(
    epi: Epilogue, ops: Operands, *, anchor_output: str
) -> tuple[str, str | None, list[str]]:
    """Where the contraction writes its tiles, what the epilogue stores back there, and which other
    values go to kernel outputs.

    The tile lives in a kernel output buffer of the domain's shape: the anchor's own output if the
    kernel returns it (the epilogue then leaves the tile alone), else the last epilogue value the
    kernel returns (stored back in place, so the common case writes memory exactly once).
    """
    produced = [v for v in epi.values if v in ops.outputs]
    if not produced:
        raise CodegenUnsupported("no value of the anchor epilogue is a kernel output")
    numel = math.prod(epi.domain)
    for name in produced:
        if math.prod(ops.shape(name)) != numel:
            raise CodegenUnsupported(f"kernel output {name!r} is not the shape of the anchor output")
    dest = anchor_output if anchor_output in produced else produced[-1]
    write_back = None if epi.root(dest) == epi.source else dest
    flat = [v for v in produced if v != dest]
    return dest, write_back, flat


def build_epilogue(
    ops: Operands,
    *,
    source: str,
    anchor_output: str,
    domain: Sequence[int],
    split: int,
    pre_steps: Sequence[Step],
    nodes: Sequence[onnx.NodeProto],
    shape_overrides: dict[str, tuple[int, ...]] | None = None,
) -> Epilogue:
    """Collect `pre_steps` (the anchor's own bias, Gemm's C) and the body's epilogue nodes.

    The domain is the anchor output's shape, left-padded to the highest rank among the values
    computed before any view (`Add(y[M,N], b[1,M,N])` yields `[1,M,N]`). Every value must have
    the domain's element count: a value that would broadcast the anchor output to more elements
    is refused, since each element of the tile must map to one output element. Views keep the
    count by construction and give the values after them their own index space.
    """
    steps = list(pre_steps)
    if steps:
        last = steps[-1]
        steps[-1] = Step(last.op_type, last.inputs, anchor_output, last.attrs)
    else:
        source = anchor_output
    steps.extend(Step.of(node) for node in nodes if node.op_type != "Constant")
    dom = tuple(int(d) for d in domain)
    numel = math.prod(dom)
    before_views = steps[: next((k for k, s in enumerate(steps) if s.is_view), len(steps))]
    rank = max([len(dom), *(len(ops.shape(s.output)) for s in before_views)])
    pad = rank - len(dom)
    dom = (1,) * pad + dom
    spaces: dict[str, tuple[int, ...]] = {}
    for s in steps:
        shape = tuple(int(d) for d in ops.shape(s.output))
        if math.prod(shape) == numel:
            spaces[s.output] = shape
        elif s.is_view or math.prod(shape) > numel:
            raise CodegenUnsupported(
                f"{s.op_type} output {s.output!r} {list(shape)} would broadcast the anchor's domain "
                f"{list(dom)} to another element count"
            )
        else:
            _broadcast_strides(shape, dom)  # a step on a smaller operand (Gemm's beta * C) runs per element
            spaces[s.output] = dom
    return Epilogue(
        source=source,
        domain=dom,
        split=split + pad,
        steps=steps,
        shape_overrides=dict(shape_overrides or {}),
        spaces=spaces,
    )
