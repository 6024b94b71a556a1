"""The `pool` template: MaxPool/AveragePool/LpPool as a direct windowed loop, epilogue fused.

The kernel is a pointwise loop over the pooled output; the pool node's rule computes one output
element by walking its window (pads, strides, dilations; ceil_mode is already in the static output
shape), and the elementwise epilogue (bias, activation, ...) is applied to that value before the
single store. AveragePool divides by the number of window positions inside the input, or, with
count_include_pad, inside the padded input (positions that only ceil_mode added are never counted,
as in onnxruntime). LpPool sums |x|^p over the window positions inside the input (padding adds
zeros) in double and returns the sum^(1/p).
"""

from __future__ import annotations

import onnx

from ..kernel_spec import KernelSpec
from .common import Block, CodegenUnsupported, Index, KernelEmitter, attrs_of, node_rule
from .pointwise import emit_pointwise


def emit_pool(spec: KernelSpec) -> str:
    """C source for a pooling kernel with its epilogue."""
    pools = [n.op_type for n in spec.nodes if n.op_type in ("MaxPool", "AveragePool", "LpPool")]
    return emit_pointwise(
        spec, f"direct windowed {'/'.join(pools) or 'pool'} loop, epilogue applied before the store"
    )


def _pads(
    node: onnx.NodeProto,
    in_sp: list[int],
    out_sp: list[int],
    kernel: list[int],
    strides: list[int],
    dil: list[int],
) -> tuple[list[int], list[int]]:
    attrs = attrs_of(node)
    nd = len(kernel)
    auto = attrs.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else str(auto)
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        head, tail = [], []
        for i in range(nd):
            total = max(0, (out_sp[i] - 1) * strides[i] + (kernel[i] - 1) * dil[i] + 1 - in_sp[i])
            small = total // 2
            h = small if auto == "SAME_UPPER" else total - small
            head.append(h)
            tail.append(total - h)
        return head, tail
    if auto == "VALID":
        return [0] * nd, [0] * nd
    pads = [int(p) for p in attrs.get("pads", [0] * (2 * nd))]  # type: ignore[union-attr]
    return pads[:nd], pads[nd:]


@node_rule("MaxPool", "AveragePool", "LpPool")
def _pool(em: KernelEmitter, block: Block, node: onnx.NodeProto, k: int, idx: Index) -> str:
    if k != 0:
        raise CodegenUnsupported(f"{node.op_type} indices output")
    attrs = attrs_of(node)
    x = em.info(node.input[0])
    out = em.info(node.output[0])
    nd = len(x.shape) - 2
    kernel = [int(v) for v in attrs["kernel_shape"]]  # type: ignore[union-attr]
    strides = [int(v) for v in attrs.get("strides", [1] * nd)]  # type: ignore[union-attr]
    dil = [int(v) for v in attrs.get("dilations", [1] * nd)]  # type: ignore[union-attr]
    in_sp, out_sp = list(x.shape[2:]), list(out.shape[2:])
    head, tail = _pads(node, in_sp, out_sp, kernel, strides, dil)
    is_max = node.op_type == "MaxPool"
    is_lp = node.op_type == "LpPool"
    p = int(attrs.get("p", 2))  # type: ignore[call-overload]
    if is_lp and p < 1:
        raise CodegenUnsupported(f"LpPool with p={p}")
    include_pad = bool(int(attrs.get("count_include_pad", 0)))  # type: ignore[call-overload]
    acc = em.fresh("p")
    valid = em.fresh("nv")
    padded = em.fresh("np")
    block.emit(f"{'float' if is_max else 'double'} {acc} = {'-INFINITY' if is_max else '0.0'};")
    if not is_max and not is_lp:
        block.emit(f"int64_t {valid} = 0, {padded} = 0;")
    pos: list[str] = []

    def nest(d: int, parent: Block) -> None:
        if d == nd:
            inside = " && ".join(f"{h} >= 0 && {h} < {in_sp[i]}" for i, h in enumerate(pos))
            if not is_max and not is_lp:
                parent.emit(f"++{padded};")
            parent.emit(f"if ({inside}) {{")
            body = parent.child()
            v = em.value(body, node.input[0], [idx[0], idx[1], *pos])
            if is_max:
                body.emit(f"{acc} = ({v}) > {acc} ? ({v}) : {acc};")
            elif is_lp:
                d = em.fresh("d")
                body.emit(f"const double {d} = (double)({v});")
                term = {1: f"fabs({d})", 2: f"{d} * {d}"}.get(p, f"pow(fabs({d}), {p}.0)")
                body.emit(f"{acc} += {term};")
            else:
                body.emit(f"{acc} += (double)({v});")
                body.emit(f"++{valid};")
            parent.extend(body)
            parent.emit("}")
            return
        w, h = em.fresh("w"), em.fresh("h")
        child = parent.child()
        child.emit(f"const int64_t {h} = ({idx[2 + d]}) * {strides[d]} - {head[d]} + {w} * {dil[d]};")
        child.emit(f"if ({h} >= {in_sp[d] + tail[d]}) break;")
        pos.append(h)
        nest(d + 1, child)
        parent.emit(f"for (int64_t {w} = 0; {w} < {kernel[d]}; ++{w}) {{")
        parent.extend(child)
        parent.emit("}")

    nest(0, block)
    if is_max:
        return acc
    if is_lp:
        return {1: f"(float)({acc})", 2: f"(float)sqrt({acc})"}.get(p, f"(float)pow({acc}, 1.0 / {p}.0)")
    divisor = padded if include_pad else valid
    return f"(float)({acc} / (double)({divisor} ? {divisor} : 1))"
