"""Differential test: a fixed-seed slice of random graphs, fused and unfused, vs onnxruntime.

The slice (SLICE_SEEDS) is compiled in one batch into the project's persistent kernel cache
(`default_cache()`: warm after a first run) and must end with zero wrong answers and zero
crashes. `pytest -s` prints the outcome table; a failing graph's line names its seed and a
minimal repro (`<tmp>/diff_<seed>.onnx` + `.npz`). `benchmarks/differential.py` runs longer
campaigns with the same code.

The harness itself is tested to fail: a model whose op was swapped (what a kernel computing the
wrong op looks like) must be judged wrong and shrunk to the swapped node.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest

from graph_autofusion.backend.cpu.cache import KernelCache, default_cache
from graph_autofusion.testing import differential
from graph_autofusion.testing.differential import (
    CRASH,
    DISPUTED,
    PASS,
    REFUSED,
    WRONG,
    check,
    counts,
    format_summary,
    host_header,
    judge,
    reference_outputs,
    run_campaign,
    shrink,
)
from graph_autofusion.testing.random_graphs import RandomGraph, generate

SLICE_SEEDS = range(200)

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def cache() -> KernelCache:
    return default_cache()


def test_the_fixed_seed_slice_has_no_wrong_answer_and_no_crash(cache: KernelCache, tmp_path: Path) -> None:
    started = time.perf_counter()
    verdicts = run_campaign(SLICE_SEEDS, cache, jobs=2, repro_dir=tmp_path)
    elapsed = time.perf_counter() - started
    table = format_summary(verdicts, ops=False)
    print(f"\n{host_header()}\n{len(verdicts)} graphs in {elapsed:.1f} s\n{table}")
    c = counts(verdicts)
    assert c[WRONG] == 0 and c[CRASH] == 0, table
    # Ours matching the float64 truth where onnxruntime does not needs a person to look: the
    # truth comes from onnx.reference, which has bugs of its own (LogSoftmax before opset 13).
    assert c[DISPUTED] == 0, table
    assert c[PASS] >= len(verdicts) * 0.8, table  # the slice checks our kernels, not the host path


def _swap_first(graph: RandomGraph, swaps: dict[str, str]) -> RandomGraph:
    model = onnx.ModelProto()
    model.CopyFrom(graph.model)
    node = next(n for n in model.graph.node if n.op_type in swaps)
    node.op_type = swaps[node.op_type]
    return replace(graph, model=model)


_SWAPS = {"Add": "Sub", "Sub": "Add", "Sigmoid": "Tanh", "Tanh": "Sigmoid", "Exp": "Softplus"}


def _swappable(seeds: range) -> RandomGraph:
    for s in seeds:
        g = generate(s)
        if any(op in _SWAPS for op in g.ops) and g.types[g.output_names[0]] == onnx.TensorProto.FLOAT:
            return g
    raise AssertionError("no swappable graph")  # pragma: no cover


def test_a_swapped_op_is_judged_wrong_and_shrunk(cache: KernelCache) -> None:
    """Compile a model with one op swapped and judge it against the original's reference."""
    original = _swappable(range(1000, 1200))
    wrong = _swap_first(original, _SWAPS)
    verdict = check(wrong, cache, reference=reference_outputs(original))
    assert verdict.status == WRONG, verdict.line()
    assert "fused" in verdict.detail and "unfused" in verdict.detail
    assert check(original, cache).status in (PASS, "host")


def test_shrink_finds_the_smallest_failing_cut(cache: KernelCache, monkeypatch: pytest.MonkeyPatch) -> None:
    """The swapped node's output alone is the minimal repro (its ancestors, nothing after it)."""
    original = next(
        g for g in (generate(s) for s in range(2000, 2400)) if len(g.ops) >= 4 and g.ops[-1] not in _SWAPS
        and any(op in _SWAPS for op in g.ops[:-1]) and g.types[g.output_names[0]] == onnx.TensorProto.FLOAT
    )  # fmt: skip
    swapped = _swap_first(original, _SWAPS)

    # Each cut is judged against the same cut of the original: the swapped op is "the bug".
    def reference_of_original(cut: RandomGraph) -> tuple[dict[str, np.ndarray], str]:
        if cut.output_names == original.output_names:
            return _reference(original)
        return _reference(original.subgraph(cut.output_names[0]))

    monkeypatch.setattr(differential, "reference_outputs", reference_of_original)
    assert check(swapped, cache).status == WRONG
    small = shrink(swapped, cache, WRONG)
    bad = next(
        n
        for n in swapped.model.graph.node
        if n.op_type != original.model.graph.node[_index(swapped, n)].op_type
    )
    assert small.output_names == [bad.output[0]], (small.ops, bad.op_type)
    assert len(small.ops) < len(swapped.ops)


def _index(graph: RandomGraph, node: onnx.NodeProto) -> int:
    return [n.name for n in graph.model.graph.node].index(node.name)


_reference = reference_outputs


def test_judge_is_tight_and_scale_aware() -> None:
    want = np.float32([1.0, -2.0, 3.0, 1e-3])
    truth = want.astype(np.float64)
    assert judge(want.copy(), want, truth, 0)[0]
    one_ulp = np.nextafter(want, np.float32(np.inf))
    assert judge(one_ulp, want, truth, 0)[0]
    assert not judge(want * np.float32(1 + 1e-4), want, truth, 0)[0]
    # Near-zero elements are judged on the tensor's scale (3.0), not on their own magnitude.
    small_off = want.copy()
    small_off[3] += 2e-6
    assert judge(small_off, want, truth, 0)[0]
    # A long reduction earns a wider tolerance, but not a 1e-3 error.
    summed = want * np.float32(1 + 3e-5)
    assert not judge(summed, want, truth, 0)[0] and judge(summed, want, truth, 256)[0]
    assert not judge(want * np.float32(1 + 1e-3), want, truth, 256)[0]
    nan = want.copy()
    nan[0] = np.nan
    assert not judge(nan, want, truth, 0)[0]
    assert not judge(want[:3], want, truth, 0)[0]
    ints = np.int64([1, 2, 3])
    assert judge(ints.copy(), ints, ints, 0)[0]
    assert not judge(ints + np.int64([0, 0, 1]), ints, ints, 0)[0]


def test_where_the_reference_misses_the_truth_it_is_disputed(cache: KernelCache) -> None:
    g = next(g for g in (generate(s) for s in range(3000, 3100)) if g.types[g.output_names[0]] == 1)
    refs, source = reference_outputs(g)
    off = {
        k: (v * np.float32(1.01) + np.float32(0.5) if v.dtype == np.float32 else v) for k, v in refs.items()
    }
    assert check(g, cache, reference=(off, source)).status == DISPUTED


def test_a_refusal_keeps_its_code(cache: KernelCache) -> None:
    g = generate(5)
    old = onnx.ModelProto()
    old.CopyFrom(g.model)
    old.opset_import[0].version = 5
    verdict = check(replace(g, model=old), cache)
    assert verdict.status == REFUSED and verdict.code == "unsupported_opset", verdict.line()
