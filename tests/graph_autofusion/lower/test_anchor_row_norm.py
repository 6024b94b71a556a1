"""Lowered anchors closing with a LayerNormalization: tiles of whole rows, each row normalised in
place after its epilogue; the rendered kernels (OpenBLAS and the contraction library with the
weight packed at load) against onnxruntime on the same nodes, with the pre-norm residual sum as a
second output and row lengths that are no multiple of a vector or panel width."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from lowered_kernels import run
from onnx import helper

import graph_autofusion as gaf
from graph_autofusion.backend.cpu.contraction import CONTRACTION_ENV
from graph_autofusion.backend.cpu.kernel_spec import KernelSpec, TensorInfo
from graph_autofusion.backend.cpu.runtime import host_steps
from graph_autofusion.kernel_ir import Kernel, Loop, format_kernel
from graph_autofusion.lower.anchor import (
    BEGIN_CALL_ROUTINE,
    NORM_ROWS,
    ROW_TILE_BYTES,
    full_row_tiles,
    lower_anchor,
    tile_sizes,
)
from graph_autofusion.plan.anchor_match import match_anchor
from graph_autofusion.verify import run_onnxruntime

F = onnx.TensorProto.FLOAT


class _Case:
    """Nodes with their input and output shapes: the kernel spec, and the model onnxruntime runs."""

    def __init__(self, nodes, inputs, outputs, inner, weights=(), constants=None) -> None:
        self.nodes, self.inputs, self.outputs = nodes, inputs, outputs
        self.constants = constants or {}
        shapes = {**inputs, **outputs, **inner}
        tensors = {n: TensorInfo(n, tuple(s), F) for n, s in shapes.items()}
        for name, value in self.constants.items():
            tensors[name] = TensorInfo(name, value.shape, helper.np_dtype_to_tensor_dtype(value.dtype))
        self.spec = KernelSpec(
            symbol="k",
            template="anchor",
            nodes=tuple(nodes),
            inputs=tuple(tensors[n] for n in inputs),
            outputs=tuple(tensors[n] for n in outputs),
            tensors=tensors,
            constants=self.constants,
            weights=frozenset(weights),
        )

    def feeds(self, seed: int = 0) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        return {n: rng.standard_normal(s).astype(np.float32) for n, s in self.inputs.items()}

    def reference(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        graph = helper.make_graph(
            list(self.nodes),
            "g",
            [helper.make_tensor_value_info(n, F, s) for n, s in self.inputs.items()],
            [helper.make_tensor_value_info(n, F, s) for n, s in self.outputs.items()],
            [onnx.numpy_helper.from_array(v, name=k) for k, v in self.constants.items()],
        )
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
        got = run_onnxruntime(m, feeds)
        return [got[n] for n in self.outputs]


def _post_ln(b: int = 2, s: int = 37, k: int = 96, n: int = 100) -> _Case:
    """BERT's output block, `LayerNorm(x @ W + bias + residual)`, the sum leaving too."""
    full = (b, s, n)
    return _Case(
        [
            helper.make_node("MatMul", ["x", "w"], ["y"]),
            helper.make_node("Add", ["y", "bias"], ["z"]),
            helper.make_node("Add", ["z", "res"], ["sum"]),
            helper.make_node("LayerNormalization", ["sum", "g", "beta"], ["o"], axis=-1, epsilon=1e-5),
        ],
        {"x": (b, s, k), "w": (k, n), "bias": (n,), "res": full, "g": (n,), "beta": (n,)},
        {"o": full, "sum": full},
        {"y": full, "z": full},
        weights=("w",),
    )


def _gemm_ln_view(m: int = 33, k: int = 40, n: int = 200) -> _Case:
    """Gemm(transB) with its bias as `beta * C`, a LayerNormalization without bias, then the
    view back to [.., 3, n] (GPT-2's `addmm` layout)."""
    return _Case(
        [
            helper.make_node("Gemm", ["x", "w", "c"], ["y"], transB=1, beta=0.5),
            helper.make_node("LayerNormalization", ["y", "g"], ["o"], axis=1, epsilon=1e-3),
            helper.make_node("Reshape", ["o", "shape"], ["r"]),
        ],
        {"x": (m, k), "w": (n, k), "c": (n,), "g": (n,)},
        {"r": (m // 3, 3, n)},
        {"y": (m, n), "o": (m, n)},
        constants={"shape": np.array([-1, 3, n], np.int64)},
    )


def _check(case: _Case, got: list[np.ndarray]) -> None:
    feeds = case.feeds()
    for out, ref in zip(got, case.reference(feeds), strict=True):
        np.testing.assert_allclose(out.reshape(ref.shape), ref, rtol=1e-4, atol=2e-5)


def _loops(kernel: Kernel, library: bool) -> list[Loop]:
    """The kernel's loops, after the call that marks its start where the library keeps its
    packing of the input operand for the call's tiles."""
    head = [s for s in kernel.body if not isinstance(s, Loop)]
    assert [c.function for c in head] == ([BEGIN_CALL_ROUTINE] if library else [])
    return [s for s in kernel.body if isinstance(s, Loop)]


@pytest.mark.parametrize("library", [False, True])
def test_row_norm_in_tiles_of_whole_rows_runs_like_onnxruntime(
    library: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """74 rows of 100 columns: 4 row tiles stream no more than 4 column tiles would, so each
    tile spans whole rows and is normalised right after its epilogue."""
    monkeypatch.setenv(CONTRACTION_ENV, "library" if library else "blas")
    case = _post_ln()
    p = match_anchor(case.spec).contraction
    assert p is not None and full_row_tiles(p)
    kernel = lower_anchor(case.spec)
    (loop,) = _loops(kernel, library)
    assert loop.parallel and loop.stop == 4  # 4 row tiles of 100 columns
    assert bool(kernel.packed) == library
    text = format_kernel(kernel)
    assert "rows normalised (LayerNormalization over 100 columns, in each tile of whole rows)" in text
    feeds = list(case.feeds().values())
    got = run(kernel, feeds, tmp_path)
    _check(case, got)


@pytest.mark.parametrize("library", [False, True])
def test_row_norm_after_the_tiles_runs_like_onnxruntime(
    library: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """64 rows, a 512 x 384 weight: whole-row tiles would stream the weight 4 times, so the
    usual column tiles run and a second parallel loop normalises blocks of rows."""
    monkeypatch.setenv(CONTRACTION_ENV, "library" if library else "blas")
    case = _post_ln(b=1, s=64, k=512, n=384)
    p = match_anchor(case.spec).contraction
    assert p is not None and not full_row_tiles(p)
    kernel = lower_anchor(case.spec)
    tiles, rows = _loops(kernel, library)
    assert tiles.parallel and tiles.stop == 4  # 4 column tiles
    assert rows.parallel and rows.stop == 64 // NORM_ROWS
    assert "LayerNormalization over 384 columns, after the tiles" in format_kernel(kernel)
    feeds = list(case.feeds().values())
    got = run(kernel, feeds, tmp_path)
    _check(case, got)


def test_gemm_with_addend_norm_without_bias_and_a_view_after_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(CONTRACTION_ENV, "blas")
    case = _gemm_ln_view()
    match = match_anchor(case.spec)
    assert match.norm is not None and match.norm.bias is None and match.norm.output == "r"
    kernel = lower_anchor(case.spec)
    _check(case, run(kernel, list(case.feeds().values()), tmp_path))


def test_a_residual_read_elsewhere_is_stored_once_more(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The pre-norm sum leaves unnormalised while the destination is normalised in place."""
    monkeypatch.setenv(CONTRACTION_ENV, "blas")
    case = _post_ln(b=1, s=5, k=8, n=33)
    kernel = lower_anchor(case.spec)
    got = run(kernel, list(case.feeds().values()), tmp_path)
    assert not np.allclose(got[0], got[1])
    _check(case, got)


def test_tiles_span_whole_rows_and_stay_in_l2() -> None:
    for m, n, k in ((512, 768, 768), (512, 768, 3072), (64, 3000, 100), (4, 100, 8)):
        case = _post_ln(b=1, s=m, k=k, n=n)
        p = match_anchor(case.spec).contraction
        assert p is not None
        mb, nb = tile_sizes(p, full_rows=True)
        assert nb == n and (mb * n * 4 <= ROW_TILE_BYTES or mb == 8)
        assert tile_sizes(p)[1] < n or n <= 256  # without the norm the columns are split


def test_small_bert_fused_with_row_norms_verifies() -> None:
    model = gaf.zoo.build("bert_base", num_layers=2, hidden=128, heads=2, seq_len=32)
    fused = gaf.fuse(model)
    norms = {
        f.name for f in fused.model.functions
        if "anchor" in f.doc_string and any(n.op_type == "LayerNormalization" for n in f.node)
    }  # fmt: skip
    calls = [n for n in fused.model.graph.node if n.op_type in norms]
    assert len(calls) == 4  # both blocks' attention output and FFN output
    assert not host_steps(fused.model)  # every kernel generated, none left to onnxruntime
    result = fused.verify()
    assert result.passed, result.to_dict()


def test_small_gpt2_chains_close_with_the_next_layer_norm_and_verify() -> None:
    """GPT-2's MLP (c_fc -> GELU -> c_proj) is a chain; its residual sum feeds the next block's
    ln_1, which the chain normalises, and leaves as the residual stream."""
    model = gaf.zoo.build("gpt2", num_layers=2, hidden=128, heads=2, seq_len=32)
    fused = gaf.fuse(model)
    chains = [g for g in fused.report()["groups"] if g["template"] == "anchor_chain"]
    assert len(chains) == 2 and all("LayerNormalization" in g["op_types"] for g in chains)
    assert not host_steps(fused.model)
    result = fused.verify()
    assert result.passed, result.to_dict()
