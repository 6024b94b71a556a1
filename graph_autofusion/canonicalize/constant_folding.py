"""Pass `constant_folding`: evaluate at compile time whatever does not depend on the graph inputs.

`Constant` nodes become initializers; a node whose inputs are all constants is evaluated with
`onnx.reference` on a one-node graph and replaced by initializers; `Shape` and `Size` of a
statically shaped tensor become constants too, which is what makes the Shape→Gather→Unsqueeze→
Concat chains exporters emit in front of every Reshape collapse into one constant shape.  A node
that does not fold gets its output types inferred on the spot (`infer_node`), so a Shape further
down the same sweep can fold even when its input's shape depends on values folded moments ago.

Evaluators are cached by (op, attributes, opset), so a BERT's hundreds of identical Gather/Unsqueeze
nodes build one evaluator each.  A fold that would materialize a huge tensor larger than its inputs
(`ConstantOfShape` of 4M+ elements, say) is skipped: it would bloat the model for no speed.  Random
ops are never folded: their value is supposed to change from run to run.
"""

from __future__ import annotations

import numpy as np
from onnx import AttributeProto, NodeProto, helper
from onnx.reference import ReferenceEvaluator

from ..onnx_utils import has_subgraph, static_shape, tensor_nbytes
from ._graph import DEFAULT_DOMAINS, WorkGraph
from .shape_inference import infer_node

#: A folded output above this many elements that is also larger than the node's inputs is not folded.
HUGE_ELEMENTS = 4 * 1024 * 1024

#: Ops not to precompute: random generators; Dropout (random in training mode) and Identity, both
#: left to remove_identity, which rewires readers instead of copying a possibly large constant.
NEVER_FOLD = frozenset(
    {
        "RandomNormal",
        "RandomNormalLike",
        "RandomUniform",
        "RandomUniformLike",
        "Multinomial",
        "Bernoulli",
        "Dropout",
        "Identity",
    }
)


class ConstantFolder:
    """Folds constants of a WorkGraph; keeps its evaluator cache across fixed-point rounds."""

    def __init__(self, work: WorkGraph) -> None:
        self.work = work
        self._evaluators: dict[bytes, ReferenceEvaluator] = {}
        self.skipped: set[str] = set()  # first outputs of nodes left unfolded because too large

    def run(self) -> int:
        """One sweep in topological order; returns the number of nodes folded away."""
        work = self.work
        kept: list[NodeProto] = []
        folded = 0
        for node in work.nodes:
            if self._fold(node):
                folded += 1
            else:
                infer_node(work, node)
                kept.append(node)
        work.nodes = kept
        return folded

    def _fold(self, node: NodeProto) -> bool:
        work = self.work
        if node.domain not in DEFAULT_DOMAINS or node.op_type in NEVER_FOLD or has_subgraph(node):
            return False
        outputs = [o for o in node.output if o]
        if not outputs or any(o in work.input_names for o in outputs):
            return False
        if node.op_type == "Constant":
            return self._fold_constant(node)
        if node.op_type in ("Shape", "Size") and node.input and node.input[0]:
            shape = static_shape(work.types[node.input[0]]) if node.input[0] in work.types else None
            if shape is not None:
                work.set_constant(node.output[0], _shape_value(node, shape))
                return True
        inputs = [i for i in node.input if i]
        if not inputs or not all(work.is_constant(i) for i in inputs):
            return False
        input_bytes = sum(tensor_nbytes(work.initializers[i]) for i in inputs)
        if self._too_big(outputs, input_bytes):
            self.skipped.add(outputs[0])
            return False
        try:
            values = self._evaluate(node)
        except Exception:  # an op the reference runtime lacks or rejects simply stays in the graph
            return False
        arrays = []
        for name, value in zip(outputs, values, strict=True):
            if not isinstance(value, np.ndarray | np.generic):
                return False
            array = np.asarray(value)
            expected = self._expected_dtype(name)
            if expected is not None and array.dtype != expected:
                array = array.astype(expected)
            arrays.append((name, array))
        if any(a.size > HUGE_ELEMENTS and a.nbytes > input_bytes for _, a in arrays):
            self.skipped.add(outputs[0])
            return False
        for name, array in arrays:
            work.set_constant(name, array)
        return True

    def _fold_constant(self, node: NodeProto) -> bool:
        attr = node.attribute[0] if len(node.attribute) == 1 else None
        if attr is not None and attr.type == AttributeProto.TENSOR:
            self.work.set_constant(node.output[0], attr.t)  # no round trip through numpy
            return True
        if attr is not None and attr.type == AttributeProto.SPARSE_TENSOR:
            return False
        try:
            (value,) = self._evaluate(node)
        except Exception:
            return False
        self.work.set_constant(node.output[0], np.asarray(value))
        return True

    def _too_big(self, outputs: list[str], input_bytes: int) -> bool:
        for name in outputs:
            type_proto = self.work.types.get(name)
            shape = static_shape(type_proto) if type_proto is not None else None
            if shape is None:
                continue
            elements = int(np.prod(shape, dtype=np.int64))
            dtype = self._expected_dtype(name)
            nbytes = elements * (dtype.itemsize if dtype is not None else 1)
            if elements > HUGE_ELEMENTS and nbytes > input_bytes:
                return True
        return False

    def _expected_dtype(self, name: str) -> np.dtype | None:
        type_proto = self.work.types.get(name)
        if type_proto is None or type_proto.WhichOneof("value") != "tensor_type":
            return None
        elem = type_proto.tensor_type.elem_type
        try:
            return helper.tensor_dtype_to_np_dtype(elem) if elem else None
        except (KeyError, TypeError, ValueError):
            return None

    def _evaluate(self, node: NodeProto) -> list[np.ndarray]:
        """Run one node with the reference runtime, reusing an evaluator for identical nodes."""
        work = self.work
        in_names = [f"i{k}" if name else "" for k, name in enumerate(node.input)]
        out_names = [f"o{k}" if name else "" for k, name in enumerate(node.output)]
        canonical = helper.make_node(node.op_type, in_names, out_names, domain=node.domain)
        canonical.attribute.extend(node.attribute)
        key = canonical.SerializeToString() + str(work.opset).encode()
        evaluator = self._evaluators.get(key)
        if evaluator is None:
            graph = helper.make_graph(
                [canonical],
                "fold",
                [helper.make_empty_tensor_value_info(n) for n in in_names if n],
                [helper.make_empty_tensor_value_info(n) for n in out_names if n],
            )
            evaluator = ReferenceEvaluator(graph, opsets={"": work.opset})
            self._evaluators[key] = evaluator
        feeds = {alias: work.array(name) for alias, name in zip(in_names, node.input, strict=True) if name}
        with np.errstate(all="ignore"):  # 1/0 folds to inf exactly as it would compute at run time
            return list(evaluator.run(None, feeds))


def _shape_value(node: NodeProto, shape: tuple[int, ...]) -> np.ndarray:
    if node.op_type == "Size":
        return np.array(int(np.prod(shape, dtype=np.int64)), dtype=np.int64)
    start, end = 0, len(shape)
    for attr in node.attribute:
        if attr.name == "start":
            start = attr.i
        elif attr.name == "end":
            end = attr.i
    return np.array(shape[start:end], dtype=np.int64)
