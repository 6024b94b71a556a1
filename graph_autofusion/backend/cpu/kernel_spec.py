"""`KernelSpec`: one kernel of a fused model, in the form the C generators consume.

The runtime builds one spec per kernel node of the fused model (a fused node's function body, or
a single default-domain op) from the model alone (docs/fused-format.md), so generators depend on
neither the planner nor onnx's function machinery.

Calling convention of every generated kernel::

    void <spec.symbol>(void *const *args);   // args = inputs in spec.inputs order, then outputs

Each pointer addresses a dense, row-major (C-contiguous) buffer of the tensor's element type.
Outputs never alias inputs. A kernel may use OpenMP; BLAS calls inside it run single-threaded.

A kernel that exports `const int64_t <symbol>_prepack_floats` takes one more pointer after its
outputs: a buffer of that many floats that the runtime fills once, at load, by calling
`void <symbol>_prepack(void *const *args, float *packed)` with the weights in place (the
constant operands of `spec.weights`, packed for the contraction library). Such a kernel also
exports `const int64_t <symbol>_prepack_only`, a mask of the parameters that only its prepack
reads (bit j: parameter j): its body does not declare them, and the runtime passes NULL for them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import onnx

from ...kernel_ir import DType
from .render_c import c_type


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    elem_type: int  # onnx.TensorProto.DataType

    @property
    def ctype(self) -> str:
        return c_type(DType.from_onnx(self.elem_type))

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(self.elem_type))


@dataclass(frozen=True)
class KernelSpec:
    symbol: str  # exported C function name (a C identifier, unique within a compiled unit)
    template: str  # pointwise | reduction | anchor | anchor_chain | pool | single
    nodes: tuple[onnx.NodeProto, ...]  # body in topological order (default-domain ops)
    inputs: tuple[TensorInfo, ...]  # kernel parameters, in call order
    outputs: tuple[TensorInfo, ...]
    tensors: dict[str, TensorInfo]  # every tensor the body reads or writes, inputs/outputs included
    constants: dict[str, np.ndarray] = field(default_factory=dict)  # values known at compile time
    pattern: str = ""  # the planner pattern that formed the group ("" for single ops)
    members: tuple[str, ...] = ()  # original node names, for the comment atop the kernel
    # Inputs bound to initializers at every call of the kernel (large ones included): an anchor
    # may have the runtime pack such an operand once at load instead of per call (contraction/).
    weights: frozenset[str] = frozenset()

    def describe(self, what: str) -> str:
        """The comment atop the generated kernel: template, members, ops, what it does, shapes."""
        members = ", ".join(self.members) or ", ".join(n.name or n.op_type for n in self.nodes)
        lines = [
            f"kernel {self.symbol}: template {self.template}"
            + (f", pattern {self.pattern}" if self.pattern else ""),
            f"members: {members}",
            f"ops: {' -> '.join(n.op_type for n in self.nodes)}",
            what,
        ]
        lines += [f"in  {t.name}: {t.ctype}{list(t.shape)}" for t in self.inputs]
        lines += [f"out {t.name}: {t.ctype}{list(t.shape)}" for t in self.outputs]
        return "\n".join(lines)
