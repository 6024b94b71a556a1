"""`single` kernels: ops outside the fused templates that still compile to a plain loop.

Each is a pointwise loop over the op's output whose rule walks the axis it needs (ArgMax/ArgMin
scan the reduced axis; CumSum sums the prefix in the same sequential float order as onnxruntime,
so results agree to the bit). Anything else becomes a host op (see hostops.py).
"""

from __future__ import annotations

import onnx

from ..kernel_spec import KernelSpec
from .common import Block, CodegenUnsupported, Index, KernelEmitter, attrs_of, node_rule, normalize_axis
from .pointwise import emit_pointwise

SINGLE_OPS = frozenset({"ArgMax", "ArgMin", "CumSum"})


def emit_single(spec: KernelSpec) -> str:
    """C source for a single-op kernel from SINGLE_OPS."""
    if len(spec.nodes) != 1 or spec.nodes[0].op_type not in SINGLE_OPS:
        raise CodegenUnsupported(f"no single-op generator for {[n.op_type for n in spec.nodes]}")
    return emit_pointwise(
        spec, f"{spec.nodes[0].op_type}: one loop over the output, the op's axis walked inline"
    )


@node_rule("ArgMax", "ArgMin")
def _arg(em: KernelEmitter, block: Block, node: onnx.NodeProto, k: int, idx: Index) -> str:
    attrs = attrs_of(node)
    x = em.info(node.input[0])
    axis = normalize_axis(int(attrs.get("axis", 0)), len(x.shape))  # type: ignore[call-overload]
    keep = int(attrs.get("keepdims", 1))  # type: ignore[call-overload]
    last = int(attrs.get("select_last_index", 0))  # type: ignore[call-overload]
    src = list(idx)
    r = em.fresh("r")
    if keep:
        src[axis] = r
    else:
        src.insert(axis, r)
    best, at = em.fresh("best"), em.fresh("at")
    cmp = (">" if node.op_type == "ArgMax" else "<") + ("=" if last else "")
    block.emit(f"{x.ctype} {best} = 0; int64_t {at} = 0;")
    block.emit(f"for (int64_t {r} = 0; {r} < {x.shape[axis]}; ++{r}) {{")
    body = block.child()
    v = em.value(body, node.input[0], src)
    body.emit(f"if ({r} == 0 || ({v}) {cmp} {best}) {{ {best} = {v}; {at} = {r}; }}")
    block.extend(body)
    block.emit("}")
    return at


@node_rule("CumSum")
def _cumsum(em: KernelEmitter, block: Block, node: onnx.NodeProto, k: int, idx: Index) -> str:
    attrs = attrs_of(node)
    x = em.info(node.input[0])
    axis = normalize_axis(em.const_ints(node.input[1], "CumSum axis")[0], len(x.shape))
    exclusive = int(attrs.get("exclusive", 0))  # type: ignore[call-overload]
    reverse = int(attrs.get("reverse", 0))  # type: ignore[call-overload]
    here = idx[axis]
    r = em.fresh("r")
    acc = em.fresh("cs")
    src = list(idx)
    src[axis] = r
    if reverse:
        lo = f"({here}) + 1" if exclusive else f"{here}"
        loop = f"for (int64_t {r} = {x.shape[axis] - 1}; {r} >= {lo}; --{r})"
    else:
        hi = f"{here}" if exclusive else f"({here}) + 1"
        loop = f"for (int64_t {r} = 0; {r} < {hi}; ++{r})"
    block.emit(f"{x.ctype} {acc} = 0;")
    block.emit(loop + " {")
    body = block.child()
    v = em.value(body, node.input[0], src)
    body.emit(f"{acc} += {v};")
    block.extend(body)
    block.emit("}")
    return acc
