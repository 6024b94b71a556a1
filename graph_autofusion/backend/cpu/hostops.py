"""Ops that run on the host through `onnx.reference` instead of as generated kernels.

Data-dependent shapes (NonZero, TopK with a runtime k), control flow (If, Loop, Scan) and the
few ops without a generator take this path. It is slow by design and never silent: every host
op is listed in `CompiledModel.stats["host_ops"]` with the reason.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from .kernel_spec import TensorInfo


class LpNormalization(OpRun):
    """x / ||x||_p along the axis. onnx.reference's own sums x**p without abs (wrong for odd p
    on negative data, e.g. p=1 flips signs); the spec and onnxruntime use |x|."""

    op_domain = ""

    def _run(self, x, axis=None, p=None):  # type: ignore[no-untyped-def]
        axis = self.axis if axis is None else axis
        p = self.p if p is None else p
        with np.errstate(all="ignore"):
            norm = np.power(np.sum(np.power(np.abs(x), p), axis=axis, keepdims=True), 1.0 / p)
            return (np.where(norm == 0, 0, x / norm).astype(x.dtype),)


# Ops onnx.reference gets wrong, replaced wherever this package evaluates a node on the host.
REFERENCE_FIXES: tuple[type[OpRun], ...] = (LpNormalization,)


def reference_evaluator(model: onnx.ModelProto) -> ReferenceEvaluator:
    """onnx.reference with REFERENCE_FIXES."""
    return ReferenceEvaluator(model, new_ops=list(REFERENCE_FIXES))


class HostOp:
    """One node evaluated by onnx.reference on numpy arrays."""

    def __init__(self, node: onnx.NodeProto, tensors: dict[str, TensorInfo], model: onnx.ModelProto) -> None:
        self.node = node
        inputs = [n for n in node.input if n]
        outputs = [n for n in node.output if n]
        graph = onnx.helper.make_graph(
            [node],
            f"host_{node.op_type}",
            [onnx.helper.make_tensor_value_info(n, tensors[n].elem_type, tensors[n].shape) for n in inputs],
            [onnx.helper.make_tensor_value_info(n, tensors[n].elem_type, tensors[n].shape) for n in outputs],
        )
        one = onnx.helper.make_model(
            graph, opset_imports=list(model.opset_import), ir_version=model.ir_version
        )
        one.functions.extend(model.functions)
        self.input_names = inputs
        self.output_names = outputs
        self._evaluator = reference_evaluator(one)

    def __call__(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        feeds = dict(zip(self.input_names, arrays, strict=True))
        return [np.asarray(v) for v in self._evaluator.run(None, feeds)]
