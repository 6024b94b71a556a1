"""The canonicalization driver: runs the passes in order, to a fixed point where it matters.

    normalize_opset → bind_shapes → remove_identity → (constant_folding ⇄ shape_inference)*
    → fold_batchnorm → remove_identity → eliminate_dead_code → constant_gather_nd
    → gather_to_slice → split_to_slices → hoist_slices → simplify_views → windowed_gemm
    → scale_after_matmul → eliminate_dead_code
    → shape_inference (+ onnxruntime fallback) → sort, name, check

Folding and inference feed each other: inference makes `Shape` outputs static so they fold, and
folding hands inference constant Reshape targets, so the pair repeats until nothing folds.  The
folder infers node by node as it sweeps, so one sweep normally settles everything and the
whole-graph inference that follows only confirms it; the loop has no fixed round cap (every round
but the last removes a node, so it ends), since a cap is a depth limit that a deep enough model
would exceed — leaving Shape ops unfolded and sending the rest to the costly onnxruntime fallback.
"""

from __future__ import annotations

from onnx import ModelProto

from ..config import FusionConfig
from ..errors import UnsupportedModelError
from ..onnx_utils import topological_order
from ._graph import WorkGraph
from .bind_shapes import bind_shapes
from .constant_folding import ConstantFolder
from .constant_gather_nd import constant_gather_nd
from .eliminate_dead_code import eliminate_dead_code
from .finalize import build, check, sort_and_name
from .fold_batchnorm import fold_batchnorm
from .gather_to_slice import gather_to_slice
from .hoist_slices import hoist_slices
from .normalize_opset import normalize_opset
from .remove_identity import remove_identity
from .scale_after_matmul import scale_after_matmul
from .shape_inference import infer_shapes, shapes_from_onnxruntime, unknown_tensors
from .simplify_views import simplify_views
from .split_to_slices import split_to_slices
from .windowed_gemm import windowed_gemm

#: The keys of the counts canonicalize returns, in the order the passes run (stable: reports print them).
PASS_NAMES = (
    "normalize_opset",
    "bind_shapes",
    "shape_inference",
    "constant_folding",
    "constant_folding_skipped",
    "fold_batchnorm",
    "remove_identity",
    "eliminate_dead_code",
    "constant_gather_nd",
    "gather_to_slice",
    "split_to_slices",
    "hoist_slices",
    "simplify_views",
    "windowed_gemm",
    "scale_after_matmul",
    "unused_initializers",
    "shape_fallback",
    "named_nodes",
)

#: The graph rewrites after folding; each can leave constants of the nodes it replaced unread.
REWRITES = (
    "constant_gather_nd",
    "gather_to_slice",
    "split_to_slices",
    "hoist_slices",
    "simplify_views",
    "windowed_gemm",
    "scale_after_matmul",
)


def canonicalize(model: ModelProto, config: FusionConfig) -> tuple[ModelProto, dict[str, int]]:
    """Return a new, canonical model and how much each pass did; `model` is not modified.

    `model` is what `load_model` returns (checked, sorted, external data resolved).

    Counts: nodes rewritten to the target opset's forms, dims bound, inference runs, nodes folded,
    folds skipped as too large, BNs folded, Identity/Dropout nodes removed, dead nodes removed,
    nodes each rewrite of `REWRITES` replaced (layout nodes hoisted over, view rewrites),
    unused initializers removed, tensors whose shape came from onnxruntime, nodes given a name.
    """
    work = WorkGraph(model)
    work.nodes = [work.nodes[i] for i in topological_order(work.nodes)]
    counts = dict.fromkeys(PASS_NAMES, 0)
    counts["normalize_opset"] = normalize_opset(work)  # first: every later pass reads one opset's forms
    counts["bind_shapes"] = bind_shapes(work, config)
    counts["remove_identity"] = remove_identity(work)  # first, so folding sees through them

    folder = ConstantFolder(work)
    first = True
    while True:
        # Fold before the first inference too: it turns Constant nodes into initializers, which
        # also sidesteps an onnx data-propagation bug around Constant outputs feeding Concat.
        folded = folder.run()
        counts["constant_folding"] += folded
        if not first and not folded:
            break
        first = False
        infer_shapes(work)
        counts["shape_inference"] += 1
    counts["constant_folding_skipped"] = len(folder.skipped)

    counts["fold_batchnorm"] = fold_batchnorm(work)
    counts["remove_identity"] += remove_identity(work)  # Dropouts whose mode folded to False
    counts["eliminate_dead_code"], counts["unused_initializers"] = eliminate_dead_code(work)
    counts["constant_gather_nd"] = constant_gather_nd(work)
    counts["gather_to_slice"] = gather_to_slice(work)
    counts["split_to_slices"] = split_to_slices(work)
    counts["hoist_slices"] = hoist_slices(work)
    counts["simplify_views"] = simplify_views(work)
    counts["windowed_gemm"] = windowed_gemm(work)
    counts["scale_after_matmul"] = scale_after_matmul(work)
    if any(counts[p] for p in REWRITES):
        dead, unused = eliminate_dead_code(work)
        counts["eliminate_dead_code"] += dead
        counts["unused_initializers"] += unused

    if counts["fold_batchnorm"] or counts["remove_identity"]:  # renamed tensors: re-check the types
        infer_shapes(work)
        counts["shape_inference"] += 1
    missing = unknown_tensors(work)
    if missing:
        counts["shape_fallback"] = shapes_from_onnxruntime(work, missing)
        missing = unknown_tensors(work)
        if missing:  # pragma: no cover - the fallback raises or fills every name it is given
            raise UnsupportedModelError(f"tensor {missing[0]!r} has no static shape.", code="unknown_shape")

    counts["named_nodes"] = sort_and_name(work)
    check(work)
    return build(work), counts
