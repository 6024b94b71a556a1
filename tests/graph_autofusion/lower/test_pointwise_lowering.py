"""Lowering the pointwise template to kernel IR: the loop nest it builds, before any renderer."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from graph_autofusion.backend.cpu.kernel_spec import KernelSpec, TensorInfo
from graph_autofusion.kernel_ir import format_kernel
from graph_autofusion.lower.pointwise import lower_pointwise

F = onnx.TensorProto.FLOAT


def _spec(nodes, inputs, outputs, constants=None, inner=None) -> KernelSpec:
    shapes = {**inputs, **outputs, **(inner or {})}
    shapes |= {k: np.shape(v) for k, v in (constants or {}).items()}
    tensors = {n: TensorInfo(n, tuple(s), F) for n, s in shapes.items()}
    return KernelSpec(
        symbol="k",
        template="pointwise",
        nodes=tuple(nodes),
        inputs=tuple(tensors[n] for n in inputs),
        outputs=tuple(tensors[n] for n in outputs),
        tensors=tensors,
        constants=constants or {},
    )


def test_broadcast_dims_coalesce_into_one_long_unit_stride_row() -> None:
    """x[1,64,56,56] + b[1,64,1,1] runs as [64, 3136] + [64, 1]: a parallel loop over channels,
    a vector loop over the 3136 pixels, the bias read once per row."""
    spec = _spec(
        [helper.make_node("Add", ["x", "b"], ["a"]), helper.make_node("Relu", ["a"], ["y"])],
        {"x": (1, 64, 56, 56), "b": (1, 64, 1, 1)},
        {"y": (1, 64, 56, 56)},
        inner={"a": (1, 64, 56, 56)},
    )
    text = format_kernel(lower_pointwise(spec))
    assert "for o < 64 parallel:" in text and "for i1 < 3136 vector:" in text
    assert "out0[add(mul(o, 3136), i1)] <- select(gt(" in text
    assert "in1[o]" in text  # the bias: one value per row


def test_small_nests_stay_serial_and_constants_become_literals_or_arrays() -> None:
    spec = _spec(
        [helper.make_node("Mul", ["x", "s"], ["m"]), helper.make_node("Add", ["m", "w"], ["y"])],
        {"x": (4, 8)},
        {"y": (4, 8)},
        {"s": np.float32(0.5), "w": np.arange(8, dtype=np.float32)},
        inner={"m": (4, 8)},
    )
    lowered = lower_pointwise(spec)
    text = format_kernel(lowered)
    assert "parallel" not in text
    assert "mul(in0[" in text and ", 0.5)" in text  # a scalar constant is a literal
    ((buf, values),) = lowered.constants  # a small array is static data of the kernel
    assert buf.name == "k_k0" and buf.size == 8 and (values == np.arange(8)).all()
    assert "k_k0[i1]" in text
