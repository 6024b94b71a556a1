"""The `pointwise` template: elementwise, broadcast and injective ops in one loop nest.

Every output is computed at each point of its own index space by inlining its producers through
their index maps (common.KernelEmitter.value), so a Transpose → Add → Relu chain reads each input
element once and writes each output element once. Outputs of the same shape share one loop nest
(and so their common subexpressions); outputs of another shape (Split) get a nest of their own.

Loop shape: all dims but the last are flattened into one outer loop `o` (OpenMP-parallel when the
nest has more than PARALLEL_MIN_ELEMENTS points), the last dim is a plain inner loop over unit-stride
outputs that gcc vectorizes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import onnx

from ....ops import OpKind, lookup
from ..kernel_spec import KernelSpec, TensorInfo
from .common import (
    PARALLEL_MIN_ELEMENTS,
    Block,
    CodegenUnsupported,
    Index,
    IndexGroup,
    KernelEmitter,
    add,
    attrs_of,
    broadcast_index,
    c_literal,
    node_rule,
    normalize_axis,
    numel,
    reshape_index,
)


def emit_pointwise(spec: KernelSpec, description: str = "") -> str:
    """C source for a pointwise kernel (also used for single injective/elementwise ops)."""
    em = KernelEmitter(spec)
    _coalesce(em)
    body = loop_nests(em, [(t.name, f"out{k}") for k, t in enumerate(spec.outputs)])
    what = description or "one loop over the output index space, producers inlined"
    return em.assemble(what, body)


_SHAPE_FREE_RULES = frozenset({"Where", "Mod", "IsInf", "Identity"})


def _coalesce(em: KernelEmitter) -> None:
    """Merge adjacent dims that every tensor of a broadcast-only kernel treats alike.

    With only elementwise/broadcast ops, dims a-1 and a can become one when each tensor (right
    aligned) has both of them full or both of size 1: `x[1,64,56,56] + b[1,64,1,1]` then runs as
    `[64, 3136] + [64, 1]`, whose inner loop is long and unit-stride. Shapes are rewritten in
    place in the emitter; row-major order makes the result identical.
    """
    spec = em.spec
    shapes = {t.shape for t in spec.outputs}
    if len(shapes) != 1 or not spec.nodes:
        return
    for node in spec.nodes:
        opdef = lookup(node.op_type)
        shape_free = node.op_type in _SHAPE_FREE_RULES or (
            opdef.kind in (OpKind.ELEMENTWISE, OpKind.BROADCAST) and opdef.c_expr is not None
        )
        if not shape_free:
            return
    out = next(iter(shapes))
    rank = len(out)
    if rank < 2:
        return
    names = {n for node in spec.nodes for n in (*node.input, *node.output) if n}
    names |= {t.name for t in (*spec.inputs, *spec.outputs)}
    padded = {}
    for name in names:
        shape = em.info(name).shape
        if len(shape) > rank:
            return
        padded[name] = (1,) * (rank - len(shape)) + tuple(shape)
    groups: list[list[int]] = [[0]]
    for a in range(1, rank):
        # Compare with the group's last dim of size > 1: a size-1 dim is both "1" and "full" for
        # every tensor, so chaining through it would merge a broadcast dim with a full one.
        prev = next((d for d in reversed(groups[-1]) if out[d] != 1), None)
        ok = prev is None or all(
            (p[prev] == 1 and p[a] == 1) or (p[prev] == out[prev] and p[a] == out[a]) for p in padded.values()
        )
        if ok or out[a] == 1:
            groups[-1].append(a)
        else:
            groups.append([a])
    if len(groups) == rank:
        return
    for name, p in padded.items():
        info = em.info(name)
        merged = tuple(math.prod(p[a] for a in g) for g in groups)
        if math.prod(merged) != info.numel:  # a dim of size 1 merged with a broadcast one: keep as is
            return
        padded[name] = merged
    for name, merged in padded.items():
        info = em.info(name)
        em.tensors[name] = TensorInfo(name, merged, info.elem_type)


def loop_nests(em: KernelEmitter, outputs: Sequence[tuple[str, str]]) -> list[str]:
    """Loop nests writing each (tensor, pointer) pair at every point of its shape."""
    by_shape: dict[tuple[int, ...], list[tuple[str, str]]] = {}
    for name, ptr in outputs:
        by_shape.setdefault(em.info(name).shape, []).append((name, ptr))
    lines: list[str] = []
    for shape, group in by_shape.items():
        lines.extend(loop_nest(em, shape, group))
    return lines


def loop_nest(em: KernelEmitter, shape: tuple[int, ...], outputs: Sequence[tuple[str, str]]) -> list[str]:
    total = numel(shape)
    if total == 0:
        return []
    parallel = total > PARALLEL_MIN_ELEMENTS
    if len(shape) == 0:
        block = Block(indent=1)
        for name, ptr in outputs:
            block.emit(f"{ptr}[0] = {em.value(block, name, [])};")
        return block.lines
    rank = len(shape)
    inner = shape[-1]
    outer = numel(shape[:-1])
    names = tuple(f"i{a}" for a in range(rank))
    em.groups = [
        IndexGroup(names, tuple(shape), f"(o * {inner} + i{rank - 1})" if outer > 1 else f"i{rank - 1}"),
        IndexGroup(names[:-1], tuple(shape[:-1]), "o"),
    ]
    lines: list[str] = []
    body = Block(indent=3)
    for a in range(rank - 1):
        stride = numel(shape[a + 1 : -1])
        expr = "o" if stride == 1 else f"o / {stride}"
        if a > 0:
            expr = f"({expr}) % {shape[a]}"
        body.emit(f"const int64_t i{a} = {expr};") if shape[a] != 1 else body.emit(f"const int64_t i{a} = 0;")
    inner_block = Block(indent=3)
    idx: Index = list(names)
    for name, ptr in outputs:
        value = em.value(inner_block, name, idx)
        inner_block.emit(f"{ptr}[{em.lin(idx, shape)}] = {value};")
    if outer > 1 or not parallel:
        if parallel:
            lines.append("  #pragma omp parallel for schedule(static)")
        lines.append(f"  for (int64_t o = 0; o < {outer}; ++o) {{")
        lines.extend(line[2:] for line in body.lines)
        lines.append("    #pragma omp simd")
        lines.append(f"    for (int64_t i{rank - 1} = 0; i{rank - 1} < {inner}; ++i{rank - 1}) {{")
        lines.extend(inner_block.lines)
        lines.append("    }")
        lines.append("  }")
    else:  # one long row: split the row itself across the team
        lines.append("  {")
        lines.append("    const int64_t o = 0;")
        lines.append("    (void)o;")
        lines.extend(line[2:] for line in body.lines)
        lines.append("    #pragma omp parallel for simd schedule(static)")
        lines.append(f"    for (int64_t i{rank - 1} = 0; i{rank - 1} < {inner}; ++i{rank - 1}) {{")
        lines.extend(inner_block.lines)
        lines.append("    }")
        lines.append("  }")
    em.groups = []
    return lines


# -- views: same elements, another shape ----------------------------------------------------------


@node_rule("Reshape", "Flatten", "Squeeze", "Unsqueeze")
def _view(em: KernelEmitter, block: Block, node: onnx.NodeProto, k: int, idx: Index) -> str:
    src = node.input[0]
    mapped = reshape_index(em, block, idx, em.info(node.output[0]).shape, em.info(src).shape)
    return em.value(block, src, mapped)


@node_rule("Identity", "Dropout")
def _identity(em: KernelEmitter, block: Block, node: onnx.NodeProto, k: int, idx: Index) -> str:
    if k != 0:
        return "1"  # Dropout's mask in inference: every element kept
    return em.value(block, node.input[0], idx)


# -- injective ops ---------------------------------------------------------------------------------


@node_rule("Transpose")
def _transpose(em: KernelEmitter, block: Block, node: onnx.NodeProto, k: int, idx: Index) -> str:
    rank = len(idx)
    perm = list(attrs_of(node).get("perm") or range(rank - 1, -1, -1))  # type: ignore[call-overload]
    src: Index = [0] * rank
    for j, p in enumerate(perm):
        src[int(p)] = idx[j]
    return em.value(block, node.input[0], src)


@node_rule("Expand")
def _expand(em: KernelEmitter, block: Block, node: onnx.NodeProto, k: int, idx: Index) -> str:
    out = em.info(node.output[0]).shape
    return em.value(block, node.input[0], broadcast_index(idx, out, em.info(node.input[0]).shape))


@node_rule("Tile")
def _tile(em: KernelEmitter, block: Block, node: onnx.NodeProto, k: int, idx: Index) -> str:
    shape = em.info(node.input[0]).shape
    src: Index = []
    for e, d, od in zip(idx, shape, em.info(node.output[0]).shape, strict=True):
        src.append(e if d == od else (0 if d == 1 else (e % d if isinstance(e, int) else f"(({e}) % {d})")))
    return em.value(block, node.input[0], src)


def _slice_params(em: KernelEmitter, node: onnx.NodeProto) -> tuple[list[int], list[int]]:
    """Effective (start, step) per axis of a Slice (ONNX clamping rules)."""
    in_shape = em.info(node.input[0]).shape
    rank = len(in_shape)
    attrs = attrs_of(node)
    if len(node.input) > 1:
        starts = em.const_ints(node.input[1], "Slice starts")
        ends = em.const_ints(node.input[2], "Slice ends")
        axes = em.const_ints(node.input[3], "Slice axes") if len(node.input) > 3 and node.input[3] else None
        steps = em.const_ints(node.input[4], "Slice steps") if len(node.input) > 4 and node.input[4] else None
    else:  # opset < 10
        starts = [int(v) for v in attrs["starts"]]  # type: ignore[union-attr]
        ends = [int(v) for v in attrs["ends"]]  # type: ignore[union-attr]
        axes = [int(v) for v in attrs.get("axes", [])] or None  # type: ignore[union-attr]
        steps = None
    axes = axes if axes is not None else list(range(len(starts)))
    steps = steps if steps is not None else [1] * len(starts)
    first = [0] * rank
    step = [1] * rank
    for s, e, a, st in zip(starts, ends, axes, steps, strict=True):
        a = normalize_axis(a, rank)
        d = in_shape[a]
        del e  # the output shape (known) already encodes where the slice ends
        if s < 0:
            s += d
        s = max(0, min(s, d)) if st > 0 else max(0, min(s, d - 1))
        first[a], step[a] = s, st
    return first, step


@node_rule("Slice")
def _slice(em: KernelEmitter, block: Block, node: onnx.NodeProto, k: int, idx: Index) -> str:
    first, step = _slice_params(em, node)
    src: Index = []
    for e, s, st in zip(idx, first, step, strict=True):
        if isinstance(e, int):
            src.append(s + e * st)
        else:
            scaled = e if st == 1 else f"{e} * ({st})"
            src.append(add(scaled, s) if s else scaled)
    return em.value(block, node.input[0], src)


@node_rule("Split")
def _split(em: KernelEmitter, block: Block, node: onnx.NodeProto, k: int, idx: Index) -> str:
    rank = len(idx)
    axis = normalize_axis(int(attrs_of(node).get("axis", 0)), rank)  # type: ignore[call-overload]
    offset = sum(em.info(out).shape[axis] for out in node.output[:k])
    src = list(idx)
    src[axis] = add(idx[axis], offset)
    return em.value(block, node.input[0], src)


@node_rule("Concat")
def _concat(em: KernelEmitter, block: Block, node: onnx.NodeProto, k: int, idx: Index) -> str:
    rank = len(idx)
    axis = normalize_axis(int(attrs_of(node)["axis"]), rank)  # type: ignore[call-overload]
    parts = [
        (name, em.info(name).shape[axis]) for name in node.input if name and em.info(name).shape[axis] > 0
    ]
    out = em.info(node.output[0])
    at = idx[axis]
    if isinstance(at, int):  # the branch is known at generation time
        offset = 0
        for name, size in parts:
            if at < offset + size:
                src = list(idx)
                src[axis] = at - offset
                return em.value(block, name, src)
            offset += size
    var = em.fresh("t")
    block.emit(f"{out.ctype} {var};")
    offset = 0
    for n, (name, size) in enumerate(parts):
        branch = block.child()
        src = list(idx)
        src[axis] = add(at, -offset) if offset else at
        value = em.value(branch, name, src)
        branch.emit(f"{var} = {value};")
        if n == 0:
            block.emit(f"if ({at} < {offset + size}) {{")
        elif n < len(parts) - 1:
            block.emit(f"}} else if ({at} < {offset + size}) {{")
        else:
            block.emit("} else {")
        block.extend(branch)
        offset += size
    if len(parts) == 1:
        block.emit("} else {")
        block.emit(f"  {var} = 0;")
    block.emit("}")
    return var


def _index_value(em: KernelEmitter, block: Block, name: str, idx: Index, dim: int) -> str | int:
    """An index tensor's value at idx, wrapped if negative and clamped into [0, dim)."""
    const = em.constant(name)
    if const is not None and const.size == 1:
        v = int(const.reshape(-1)[0])
        return v + dim if v < 0 else v
    raw = em.value(block, name, idx)
    var = em.fresh("ix")
    block.emit(f"int64_t {var} = (int64_t)({raw});")
    block.emit(f"{var} = {var} < 0 ? {var} + {dim} : {var};")
    block.emit(f"{var} = {var} < 0 ? 0 : ({var} >= {dim} ? {dim - 1} : {var});")
    return var


@node_rule("Gather")
def _gather(em: KernelEmitter, block: Block, node: onnx.NodeProto, k: int, idx: Index) -> str:
    data = em.info(node.input[0]).shape
    indices = em.info(node.input[1]).shape
    axis = normalize_axis(int(attrs_of(node).get("axis", 0)), len(data))  # type: ignore[call-overload]
    q = len(indices)
    at = _index_value(em, block, node.input[1], list(idx[axis : axis + q]), data[axis])
    src = [*idx[:axis], at, *idx[axis + q :]]
    return em.value(block, node.input[0], src)


@node_rule("GatherElements")
def _gather_elements(em: KernelEmitter, block: Block, node: onnx.NodeProto, k: int, idx: Index) -> str:
    data = em.info(node.input[0]).shape
    axis = normalize_axis(int(attrs_of(node).get("axis", 0)), len(data))  # type: ignore[call-overload]
    at = _index_value(em, block, node.input[1], list(idx), data[axis])
    src = list(idx)
    src[axis] = at
    return em.value(block, node.input[0], src)


@node_rule("Where")
def _where(em: KernelEmitter, block: Block, node: onnx.NodeProto, k: int, idx: Index) -> str:
    out = em.info(node.output[0]).shape
    args = [em.value(block, n, broadcast_index(idx, out, em.info(n).shape)) for n in node.input]
    return f"(({args[0]}) ? ({args[1]}) : ({args[2]}))"


@node_rule("Pad")
def _pad(em: KernelEmitter, block: Block, node: onnx.NodeProto, k: int, idx: Index) -> str:
    attrs = attrs_of(node)
    in_info = em.info(node.input[0])
    rank = len(idx)
    mode = attrs.get("mode", b"constant")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if len(node.input) > 1 and node.input[1]:
        pads = em.const_ints(node.input[1], "Pad pads")
        axes = (
            em.const_ints(node.input[3], "Pad axes")
            if len(node.input) > 3 and node.input[3]
            else list(range(rank))
        )
    else:
        pads = [int(v) for v in attrs.get("pads", [])]  # type: ignore[union-attr]
        axes = list(range(rank))
    begin = [0] * rank
    for j, a in enumerate(axes):
        begin[normalize_axis(a, rank)] = pads[j]
    fill = "0"
    if mode == "constant" and len(node.input) > 2 and node.input[2]:
        # A scalar, or a one-element tensor (as Attention's expansion writes it): its only element.
        fill = em.value(block, node.input[2], [0] * len(em.info(node.input[2]).shape))
    elif mode == "constant" and "value" in attrs:
        fill = c_literal(attrs["value"], in_info.elem_type)
    src: Index = []
    conds: list[str] = []
    for e, b, d in zip(idx, begin, in_info.shape, strict=True):
        j = add(e, -b) if b else e
        if mode == "constant":
            if b or em.info(node.output[0]).shape[len(src)] != d:
                conds.append(f"({j}) >= 0 && ({j}) < {d}")
            src.append(j)
        elif mode == "edge":
            src.append(f"(({j}) < 0 ? 0 : (({j}) >= {d} ? {d - 1} : ({j})))")
        elif mode == "reflect":
            r = em.declare(block, "int64_t", f"({j}) < 0 ? -({j}) : ({j})", "r")
            src.append(f"({r} >= {d} ? {2 * (d - 1)} - {r} : {r})")
        else:
            raise CodegenUnsupported(f"Pad mode {mode!r}")
    if not conds:
        return em.value(block, node.input[0], src)
    out_type = em.info(node.output[0]).ctype
    var = em.fresh("t")
    branch = block.child()
    value = em.value(branch, node.input[0], src)
    branch.emit(f"{var} = {value};")
    block.emit(f"{out_type} {var} = {fill};")
    block.emit(f"if ({' && '.join(conds)}) {{")
    block.extend(branch)
    block.emit("}")
    return var


@node_rule("Trilu")
def _trilu(em: KernelEmitter, block: Block, node: onnx.NodeProto, k: int, idx: Index) -> str:
    upper = int(attrs_of(node).get("upper", 1))  # type: ignore[call-overload]
    shift = em.const_ints(node.input[1], "Trilu k")[0] if len(node.input) > 1 and node.input[1] else 0
    i, j = idx[-2], idx[-1]
    value = em.value(block, node.input[0], idx)
    cond = f"(({j}) - ({i}) >= {shift})" if upper else f"(({j}) - ({i}) <= {shift})"
    return f"({cond} ? ({value}) : 0)"


@node_rule("ReverseSequence")
def _reverse_sequence(em: KernelEmitter, block: Block, node: onnx.NodeProto, k: int, idx: Index) -> str:
    """out[.., t, ..] = x[.., len-1-t, ..] for t < len (len = sequence_lens[batch]), else x[.., t, ..].

    The lengths are data (read per element), clamped into [0, steps] so a bad length never reads
    outside the tensor.
    """
    attrs = attrs_of(node)
    shape = em.info(node.input[0]).shape
    batch = int(attrs.get("batch_axis", 1))  # type: ignore[call-overload]
    time = int(attrs.get("time_axis", 0))  # type: ignore[call-overload]
    steps = shape[time]
    raw = em.value(block, node.input[1], [idx[batch]])
    n, t = em.fresh("len"), em.fresh("rt")
    block.emit(f"int64_t {n} = (int64_t)({raw});")
    block.emit(f"{n} = {n} < 0 ? 0 : ({n} > {steps} ? {steps} : {n});")
    block.emit(f"const int64_t {t} = ({idx[time]}) < {n} ? {n} - 1 - ({idx[time]}) : ({idx[time]});")
    src = list(idx)
    src[time] = t
    return em.value(block, node.input[0], src)


@node_rule("DepthToSpace")
def _depth_to_space(em: KernelEmitter, block: Block, node: onnx.NodeProto, k: int, idx: Index) -> str:
    attrs = attrs_of(node)
    b = int(attrs["blocksize"])  # type: ignore[call-overload]
    mode = attrs.get("mode", b"DCR")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    c_out = em.info(node.output[0]).shape[1]
    n, c, h, w = idx
    i, j = f"(({h}) % {b})", f"(({w}) % {b})"
    channel = (
        f"(({i} * {b} + {j}) * {c_out} + ({c}))" if mode == "DCR" else f"(({c}) * {b * b} + {i} * {b} + {j})"
    )
    return em.value(block, node.input[0], [n, channel, f"(({h}) / {b})", f"(({w}) / {b})"])


@node_rule("SpaceToDepth")
def _space_to_depth(em: KernelEmitter, block: Block, node: onnx.NodeProto, k: int, idx: Index) -> str:
    attrs = attrs_of(node)
    b = int(attrs["blocksize"])  # type: ignore[call-overload]
    mode = attrs.get("mode", b"DCR")
    c_in = em.info(node.input[0]).shape[1]
    n, c, h, w = idx
    if mode in (b"CRD", "CRD"):
        ij, ch = f"(({c}) % {b * b})", f"(({c}) / {b * b})"
    else:
        ij, ch = f"(({c}) / {c_in})", f"(({c}) % {c_in})"
    return em.value(
        block, node.input[0], [n, ch, f"(({h}) * {b} + {ij} / {b})", f"(({w}) * {b} + {ij} % {b})"]
    )


@node_rule("BatchNormalization")
def _batchnorm(em: KernelEmitter, block: Block, node: onnx.NodeProto, k: int, idx: Index) -> str:
    if k != 0:
        raise CodegenUnsupported("BatchNormalization in training mode")
    eps = float(attrs_of(node).get("epsilon", 1e-5))  # type: ignore[arg-type]
    c = idx[1] if len(idx) > 1 else 0
    x = em.value(block, node.input[0], idx)
    scale, bias, mean, var = (em.value(block, n, [c]) for n in node.input[1:5])
    eps_c = c_literal(eps, onnx.TensorProto.FLOAT)
    return f"((({x}) - ({mean})) / sqrtf(({var}) + {eps_c}) * ({scale}) + ({bias}))"


# -- elementwise ops whose attributes change the formula -------------------------------------------


@node_rule("IsInf")
def _isinf(em: KernelEmitter, block: Block, node: onnx.NodeProto, k: int, idx: Index) -> str:
    attrs = attrs_of(node)
    x = em.value(block, node.input[0], idx)
    pos = int(attrs.get("detect_positive", 1))  # type: ignore[call-overload]
    neg = int(attrs.get("detect_negative", 1))  # type: ignore[call-overload]
    if pos and neg:
        return f"((uint8_t)(isinf({x}) != 0))"
    if pos:
        return f"((uint8_t)(({x}) == INFINITY))"
    if neg:
        return f"((uint8_t)(({x}) == -INFINITY))"
    return "((uint8_t)0)"


@node_rule("Mod")
def _mod(em: KernelEmitter, block: Block, node: onnx.NodeProto, k: int, idx: Index) -> str:
    out = em.info(node.output[0])
    a, b = (em.value(block, n, broadcast_index(idx, out.shape, em.info(n).shape)) for n in node.input)
    if out.elem_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE):
        if int(attrs_of(node).get("fmod", 0)):  # type: ignore[call-overload]
            # fmod=1: C's truncating remainder (the dividend's sign). A zero divisor gives 0, as
            # af_mod; -1 gives 0 without evaluating INT_MIN % -1 (undefined behaviour in C).
            d = em.declare(block, out.ctype, f"{b}", "d")
            return f"(({d}) == 0 || ({d}) == -1 ? ({out.ctype})0 : ({out.ctype})(({a}) % ({d})))"
        return f"(({out.ctype})af_mod({a}, {b}))"
    fmod = "fmodf" if out.elem_type == onnx.TensorProto.FLOAT else "fmod"
    if int(attrs_of(node).get("fmod", 0)):  # type: ignore[call-overload]
        return f"{fmod}({a}, {b})"
    # fmod=0 on floats: the result takes the divisor's sign, as numpy's mod does.
    r = em.declare(block, out.ctype, f"{fmod}({a}, {b})", "m")
    return f"(({r}) != 0 && (({r}) < 0) != (({b}) < 0) ? ({r}) + ({b}) : ({r}))"
