"""Last step of canonicalization: order, name and check the result.

Later stages rely on three invariants: nodes in topological order, every node a unique non-empty
name (reports and fused-function member lists refer to nodes by name), and a model that passes
`onnx.checker` with full shape checking.  The checker runs on the light copy (weights as typed
inputs), which checks the same structure in milliseconds instead of seconds.
"""

from __future__ import annotations

import onnx
from onnx import ModelProto

from ..errors import InvalidModelError
from ..onnx_utils import topological_order
from ._graph import WorkGraph


def sort_and_name(work: WorkGraph) -> int:
    """Sort nodes topologically and name unnamed or duplicate nodes; returns how many were renamed."""
    work.nodes = [work.nodes[i] for i in topological_order(work.nodes)]
    taken = {n.name for n in work.nodes if n.name}  # generated names never clash with given ones
    used: set[str] = set()
    renamed = 0
    for index, node in enumerate(work.nodes):
        if node.name and node.name not in used:  # the first holder of a name keeps it
            used.add(node.name)
            continue
        name, k = f"{node.op_type}_{index}", 0
        while name in taken:
            k += 1
            name = f"{node.op_type}_{index}_{k}"
        taken.add(name)
        used.add(name)
        node.name = name
        renamed += 1
    return renamed


def check(work: WorkGraph) -> None:
    """Full onnx.checker on the light model; a failure here is an engine bug, reported as such."""
    try:
        onnx.checker.check_model(work.to_model(light=True, final=True), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise InvalidModelError(
            f"the canonicalized model fails the ONNX checker: {str(exc).strip()}",
            code="invalid_graph",
        ) from exc


def build(work: WorkGraph) -> ModelProto:
    return work.to_model(final=True)
