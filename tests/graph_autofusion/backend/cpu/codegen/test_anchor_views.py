"""MatMul operands read in place through Split / step-1 Slice windows (a base offset), against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from anchor_helpers import check, contraction_calls, make_case, rand, reads_at_offset, spec_for
from onnx import helper

from graph_autofusion.backend.cpu.codegen.anchor import emit_anchor
from graph_autofusion.backend.cpu.codegen.common import CodegenUnsupported

B, S, H, D = 2, 8, 4, 6


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(4321)


def _node(op: str, ins: list[str], outs: list[str], **attrs: object):
    return helper.make_node(op, ins, outs, **attrs)


def _no_copy(source: str) -> None:
    assert "pa[" not in source and "pb[" not in source


def test_fused_qkv_split_feeds_attention_scores_in_place(rng: np.random.Generator) -> None:
    """GPT-2: Split(qkv) -> Reshape -> Transpose per head; Q and K are offsets into one buffer."""
    hd = H * D
    case = make_case(
        [
            _node("Split", ["qkv", "sizes"], ["q", "k", "v"], axis=2),
            _node("Reshape", ["q", "shape"], ["q4"]),
            _node("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]),
            _node("Reshape", ["k", "shape"], ["k4"]),
            _node("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
            _node("MatMul", ["qt", "kt"], ["scores"]),
            _node("Mul", ["scores", "scale"], ["o"]),
        ],
        {"qkv": rand(rng, B, S, 3 * hd)},
        ["o"],
        {
            "sizes": np.array([hd, hd, hd], dtype=np.int64),
            "shape": np.array([B, S, H, D], dtype=np.int64),
            "scale": np.array(0.25, dtype=np.float32),
        },
    )
    kernel = check(case, "split_qk", k=D, method="batched_gemm")
    assert reads_at_offset(kernel.source, hd)  # K starts hd elements into the row
    _no_copy(kernel.source)


def test_equal_split_last_output_feeds_attention_context(rng: np.random.Generator) -> None:
    """Split into equal parts (opset 18 num_outputs): V is the last third of each row."""
    hd = H * D
    case = make_case(
        [
            _node("Split", ["qkv"], ["q", "k", "v"], axis=-1, num_outputs=3),
            _node("Reshape", ["v", "shape"], ["v4"]),
            _node("Transpose", ["v4"], ["vt"], perm=[0, 2, 1, 3]),
            _node("MatMul", ["p", "vt"], ["o"]),
        ],
        {"p": rand(rng, B, H, S, S), "qkv": rand(rng, B, S, 3 * hd)},
        ["o"],
        {"shape": np.array([B, S, H, D], dtype=np.int64)},
        template="single",
        opset=18,
    )
    kernel = check(case, "split_v", k=S, method="batched_gemm")
    assert reads_at_offset(kernel.source, 2 * hd)
    _no_copy(kernel.source)


def test_split_attribute_form_uneven_sizes(rng: np.random.Generator) -> None:
    """Opset 11 `split` attribute with unequal parts; the middle output feeds the weights side."""
    case = make_case(
        [
            _node("Split", ["w"], ["w0", "w1", "w2"], axis=1, split=[3, 5, 4]),
            _node("MatMul", ["x", "w1"], ["y"]),
            _node("Relu", ["y"], ["o"]),
        ],
        {"x": rand(rng, 10, 16), "w": rand(rng, 16, 12)},
        ["o"],
        opset=11,
    )
    kernel = check(case, "split_attr", k=16, method="gemm")
    assert reads_at_offset(kernel.source, 3)
    _no_copy(kernel.source)


@pytest.mark.parametrize(
    ("starts", "ends", "axes"),
    [([8], [16], [-1]), ([-8], [1 << 62], [2]), ([1, 4], [7, 12], [1, 2])],
)
def test_step1_slice_is_an_offset_view(
    rng: np.random.Generator, starts: list, ends: list, axes: list
) -> None:
    """A step-1 Slice (also with negative / clamped bounds, several axes) is read in place."""
    case = make_case(
        [
            _node("Slice", ["x", "starts", "ends", "axes"], ["xs"]),
            _node("MatMul", ["xs", "w"], ["o"]),
        ],
        {"x": rand(rng, 2, 8, 16)},
        ["o"],
        {
            "starts": np.array(starts, dtype=np.int64),
            "ends": np.array(ends, dtype=np.int64),
            "axes": np.array(axes, dtype=np.int64),
            "w": rand(rng, 8, 5),
        },
        template="single",
    )
    kernel = check(case, "slice_view", k=8)
    _no_copy(kernel.source)


def test_slice_then_transpose_composes(rng: np.random.Generator) -> None:
    """Slice rows of a matrix, then transpose it: the offset survives the stride permutation."""
    case = make_case(
        [
            _node("Slice", ["a", "starts", "ends", "axes"], ["as"]),
            _node("Transpose", ["as"], ["at"], perm=[1, 0]),
            _node("MatMul", ["at", "w"], ["o"]),
        ],
        {"a": rand(rng, 20, 9)},
        ["o"],
        {
            "starts": np.array([4], dtype=np.int64),
            "ends": np.array([16], dtype=np.int64),
            "axes": np.array([0], dtype=np.int64),
            "w": rand(rng, 12, 7),
        },
        template="single",
    )
    kernel = check(case, "slice_t", k=12, method="gemm")
    assert contraction_calls(kernel.source)[0].strip().startswith("af_sgemm_tile(1, ")  # A transposed
    assert reads_at_offset(kernel.source, 36)


def test_strided_slice_is_refused(rng: np.random.Generator) -> None:
    """A step-2 Slice is a gather, not a view: codegen refuses instead of reading wrong elements."""
    case = make_case(
        [
            _node("Slice", ["x", "starts", "ends", "axes", "steps"], ["xs"]),
            _node("MatMul", ["xs", "w"], ["o"]),
        ],
        {"x": rand(rng, 6, 16)},
        ["o"],
        {
            "starts": np.array([0], dtype=np.int64),
            "ends": np.array([16], dtype=np.int64),
            "axes": np.array([1], dtype=np.int64),
            "steps": np.array([2], dtype=np.int64),
            "w": rand(rng, 8, 5),
        },
        template="single",
    )
    spec, _ = spec_for(case, "slice_step2")
    with pytest.raises(CodegenUnsupported, match="step-1"):
        emit_anchor(spec)
