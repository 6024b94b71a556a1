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

from .kernel_spec import TensorInfo


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
        self._evaluator = ReferenceEvaluator(one)

    def __call__(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        feeds = dict(zip(self.input_names, arrays, strict=True))
        return [np.asarray(v) for v in self._evaluator.run(None, feeds)]
