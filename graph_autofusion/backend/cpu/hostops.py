"""Ops that run on the host through `onnx.reference` instead of as generated kernels.

Data-dependent shapes (NonZero, TopK with a runtime k), control flow (If, Loop, Scan) and the
few ops without a generator take this path. It is slow by design and never silent: every host
op is listed in `CompiledModel.stats["host_ops"]` and in `FusedGraph.report()["host_ops"]` with a
stable reason code (`HOST_REASONS`), and `FusionConfig.allow_host_ops = False` turns any of them
into a `host_op_refused` error.

Control flow: the bodies of If/Loop/Scan may read values of the enclosing graph by name (ONNX's
implicit inputs). Those names are inputs of the host op like its explicit ones — the arena keeps
them alive until it runs, and they are fed to the evaluator as inputs of the one-node graph the op
is wrapped in, where its subgraphs find them by the usual lexical scoping.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from ...errors import RuntimeInputError, UnsupportedModelError
from ...onnx_utils import node_inputs
from .kernel_spec import TensorInfo

if TYPE_CHECKING:
    from .extract import HostStep

#: Every reason a node runs on the host, by stable code.
HOST_REASONS: dict[str, str] = {
    "no_generator": "the op has no code generator (data-dependent shapes, rare ops)",
    "control_flow": "If/Loop/Scan: the subgraphs are interpreted by onnx.reference",
    "foreign_domain": "an operator outside the default ONNX domain",
    "legacy_semantics": "an old-opset form of an op (e.g. Softmax before opset 13)",
    "unsupported_variant": "an attribute or output combination the generator does not cover",
    "codegen_unsupported": "the generator declined this fused group or op (its message says why)",
}


def host_op_entry(step: HostStep) -> dict[str, Any]:
    """The report's record of one host op: which node, its op, a stable code and a sentence."""
    return {"node": step.node.name, "op_type": step.node.op_type, "code": step.code, "reason": step.reason}


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
        inputs = node_inputs(node)  # explicit inputs, then the subgraphs' outer-scope reads
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
        try:
            self._evaluator = reference_evaluator(one)
        except Exception as exc:  # onnx.reference raises plain errors for ops it lacks
            raise UnsupportedModelError(
                f"{node.op_type} node {node.name!r} can neither be compiled nor run by onnx.reference: "
                f"{str(exc).strip().splitlines()[0][:300]}",
                code="unsupported_host_op",
                node=node.name,
                op_type=node.op_type,
            ) from exc

    def __call__(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        feeds = dict(zip(self.input_names, arrays, strict=True))
        try:
            return [np.asarray(v) for v in self._evaluator.run(None, feeds)]
        except Exception as exc:  # a refusal with the node's name, not a stack trace from inside onnx
            raise RuntimeInputError(
                f"host op {self.node.op_type} ({self.node.name!r}) failed on these inputs: "
                f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}",
                code="host_op_failed",
                node=self.node.name,
                op_type=self.node.op_type,
            ) from exc
