"""ONNX backend node conformance: every fp32 case of every op the registry claims runs compiled.

The cases come from `onnx.backend.test.case.node` (built in memory by the installed onnx). Each
case's model is compiled by the real runtime into one shared session cache: all unique kernels
are built first in a few combined compiler runs, so the whole module costs a few seconds.

Each case runs twice, on an arena poisoned with a different byte pattern before each run, and the
two runs must agree bit for bit (a read of memory no kernel wrote fails the case).
A claimed op must pass 100% of its fp32 cases at rtol 1e-5 / atol 1e-6, as compiled kernels (a
case that silently fell back to the onnx.reference host path does not count), unless the case is
listed in KNOWN_GAPS with the reason. A listed case that starts passing fails the test too, so
the table never outlives the gap. `pytest -s` prints the pass rate per op and overall; the same
table is in every assertion message.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np
import pytest

from graph_autofusion.backend.cpu.cache import KernelCache
from graph_autofusion.backend.cpu.conformance import (
    HOST,
    MISMATCH,
    PASS,
    Case,
    Outcome,
    claimed_ops,
    collect_cases,
    compare,
    format_summary,
    precompile,
    run_case,
    summarize,
)
from graph_autofusion.ops import lookup

_TRAINING_DROPOUT = (
    "training_mode input: a random mask, not inference; extract keeps it off the view path (host op)"
)
_BN_TRAINING = "training_mode=1 (batch statistics, running mean/var outputs): only inference BN compiles"
_DROPOUT_MASK = "the optional mask output: only a mask-free inference Dropout is aliased as a view (host op)"
_GROUP_NORM = "GroupNormalization has no generator (no rule in reduction.py): host op"
_MAXPOOL_INDICES = "MaxPool's Indices output: pool.py computes values only, extract sends it to the host"
_EMPTY_REDUCE = (
    "reduction over a zero-size tensor: reduction.py declines it (CodegenUnsupported), so it runs on the host"
)

KNOWN_GAPS: Mapping[str, str] = {
    "test_batchnorm_example_training_mode": _BN_TRAINING,
    "test_batchnorm_epsilon_training_mode": _BN_TRAINING,
    "test_dropout_default_mask": _DROPOUT_MASK,
    "test_dropout_default_mask_ratio": _DROPOUT_MASK,
    "test_training_dropout_default": _TRAINING_DROPOUT,
    "test_training_dropout_default_mask": _TRAINING_DROPOUT,
    "test_training_dropout": _TRAINING_DROPOUT,
    "test_training_dropout_mask": _TRAINING_DROPOUT,
    "test_training_dropout_zero_ratio": _TRAINING_DROPOUT,
    "test_training_dropout_zero_ratio_mask": _TRAINING_DROPOUT,
    "test_group_normalization_example": _GROUP_NORM,
    "test_group_normalization_epsilon": _GROUP_NORM,
    "test_maxpool_with_argmax_2d_precomputed_pads": _MAXPOOL_INDICES,
    "test_maxpool_with_argmax_2d_precomputed_strides": _MAXPOOL_INDICES,
    "test_reduce_log_sum_empty_set": _EMPTY_REDUCE,
    "test_reduce_log_sum_exp_empty_set": _EMPTY_REDUCE,
    "test_reduce_l1_empty_set": _EMPTY_REDUCE,
    "test_reduce_l2_empty_set": _EMPTY_REDUCE,
    "test_reduce_max_empty_set": _EMPTY_REDUCE,
    "test_reduce_min_empty_set": _EMPTY_REDUCE,
    "test_reduce_prod_empty_set": _EMPTY_REDUCE,
    "test_reduce_sum_empty_set": _EMPTY_REDUCE,
    "test_reduce_sum_empty_set_non_reduced_axis_zero": _EMPTY_REDUCE,
    "test_reduce_sum_square_empty_set": _EMPTY_REDUCE,
}

# Claimed ops for which the installed onnx generates no fp32 case (only integer, bool, string,
# fp16/bf16/fp64 or TensorProto-typed data). Listed so that a new case, or a newly claimed op
# without one, is noticed.
WITHOUT_FLOAT_CASES: Mapping[str, str] = {
    "And": "bool inputs only",
    "Or": "bool inputs only",
    "Xor": "bool inputs only",
    "Not": "bool inputs only",
    "Equal": "integer and string inputs only",
    "Trilu": "int64 data only",
    "CumSum": "float64 and int32 data only",
    "Cast": "every case converts to or from a type other than fp32 (fp16, bf16, fp8, fp64, string)",
}

# Collecting the cases takes ~9 s and compiling ~400 kernels a few more; a hung kernel must not
# hold CI for the default 10 minutes.
pytestmark = pytest.mark.timeout(240)

FAMILIES = ("elementwise", "broadcast", "injective", "reduce", "anchor", "view")


@dataclass(frozen=True)
class Run:
    cases: list[Case]
    outcomes: dict[str, Outcome]

    def table(self) -> str:
        return format_summary(summarize(self.outcomes.values(), KNOWN_GAPS))


@pytest.fixture(scope="session")
def conformance(kernel_cache: KernelCache) -> Run:
    """Every claimed fp32 case, compiled in one batch into the session cache and run once."""
    cases = collect_cases()
    precompile(cases, kernel_cache, jobs=2)
    outcomes = {c.name: run_case(c, kernel_cache) for c in cases}
    run = Run(cases, outcomes)
    print("\nONNX node conformance of the CPU runtime (fp32 cases of claimed ops)\n" + run.table())
    return run


def _family(op_type: str) -> str:
    return lookup(op_type).kind.label


@pytest.mark.parametrize("family", FAMILIES)
def test_claimed_ops_pass_their_float_cases(conformance: Run, family: str) -> None:
    outcomes = [o for o in conformance.outcomes.values() if _family(o.op_type) == family]
    assert outcomes, f"no conformance case for the {family} family"
    failures = [
        f"{o.case} [{o.op_type}] {o.status}: {o.detail}"
        for o in outcomes
        if o.status != PASS and o.case not in KNOWN_GAPS
    ]
    stale = [o.case for o in outcomes if o.status == PASS and o.case in KNOWN_GAPS]
    table = format_summary(summarize(outcomes, KNOWN_GAPS))
    assert not failures, f"{family}: failing cases\n" + "\n".join(failures) + "\n\n" + table
    assert not stale, f"{family}: these KNOWN_GAPS cases now pass, remove them: {stale}\n\n{table}"


def test_known_gaps_name_collected_cases(conformance: Run) -> None:
    unknown = sorted(set(KNOWN_GAPS) - set(conformance.outcomes))
    assert not unknown, f"KNOWN_GAPS names cases that are not collected: {unknown}"


def test_every_claimed_op_has_float_cases_or_says_why(conformance: Run) -> None:
    covered = {c.op_type for c in conformance.cases}
    missing = sorted(claimed_ops() - covered - set(WITHOUT_FLOAT_CASES))
    stale = sorted(set(WITHOUT_FLOAT_CASES) & covered)
    assert not missing, f"claimed ops with no fp32 conformance case and no reason: {missing}"
    assert not stale, f"WITHOUT_FLOAT_CASES lists ops that now have fp32 cases: {stale}"


def test_a_wrong_expected_output_is_reported(conformance: Run, kernel_cache: KernelCache) -> None:
    """The harness can fail: perturb one expected value of a passing case."""
    case = next(c for c in conformance.cases if c.name == "test_relu")
    name, want = next(iter(case.expected.items()))
    wrong = want.copy()
    wrong.flat[0] += 1e-3 + abs(float(wrong.flat[0])) * 1e-3
    outcome = run_case(replace(case, expected={name: wrong}), kernel_cache)
    assert outcome.status == MISMATCH, outcome
    assert "1/" in outcome.detail


def test_a_host_fallback_is_not_a_pass(conformance: Run) -> None:
    assert conformance.outcomes["test_maxpool_with_argmax_2d_precomputed_pads"].status == HOST


def test_compare_handles_nan_inf_and_integers() -> None:
    nan_inf = np.array([np.nan, np.inf, -np.inf, 1.0], dtype=np.float32)
    assert compare(nan_inf, nan_inf.copy())[0]
    assert not compare(nan_inf, np.array([np.nan, np.inf, np.inf, 1.0], dtype=np.float32))[0]
    assert not compare(np.array([1, 2], dtype=np.int64), np.array([1, 3], dtype=np.int64))[0]
    assert not compare(np.zeros(2, np.float32), np.zeros(2, np.float64))[0]
    assert compare(np.float32([1.0]), np.float32([1.0 + 5e-6]))[0]
    assert not compare(np.float32([1.0]), np.float32([1.0 + 5e-5]))[0]
