"""The whole ONNX node suite through `fuse` and the compiled runtime: no case may be a wrong answer.

Every case onnx ships (all ops, all dtypes, `_expanded` bodies) is fused, compiled into one
session cache and run twice, with the arena poisoned differently before each run
(`CompiledModel.poison`): a kernel that reads memory nothing wrote gives NaN or a different
answer, and the case counts as wrong. Cases may be refused (a stable code) or run partly on the
host, but an engine crash must be listed in KNOWN_ERRORS with its reason (none is today), and a
listed case that stops crashing fails the test too. `pytest -s` prints the table (benchmarks/conformance.py
prints the same with the host's CPU and ISA).
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from graph_autofusion.backend.cpu.cache import KernelCache
from graph_autofusion.backend.cpu.suite import (
    ERROR,
    HOST,
    PASS,
    REFUSED,
    WRONG,
    SuiteOutcome,
    format_suite,
    run_suite,
    suite_cases,
)

# Engine crashes (status `error`) the suite tolerates, by case, with the reason. Empty: a host op
# that fails on its inputs (ImageDecoder without Pillow, an opset-8 Scan) is refused with
# `host_op_failed` by the runtime.
KNOWN_ERRORS: Mapping[str, str] = {}

# Collecting ~1900 cases takes ~9 s, fusing and compiling them ~30 s on two cores.
pytestmark = pytest.mark.timeout(400)


@pytest.fixture(scope="module")
def suite(kernel_cache: KernelCache) -> dict[str, SuiteOutcome]:
    outcomes = run_suite(suite_cases(), kernel_cache, repeat=2, jobs=2)
    print("\nThe ONNX node suite through fuse + the compiled runtime\n" + format_suite(outcomes))
    return {o.case: o for o in outcomes}


def test_no_case_is_a_wrong_answer(suite: dict[str, SuiteOutcome]) -> None:
    wrong = {name: o.detail for name, o in suite.items() if o.status == WRONG}
    assert not wrong, format_suite(list(suite.values()), per_op=False)


def test_engine_crashes_are_the_listed_ones(suite: dict[str, SuiteOutcome]) -> None:
    errors = {name: o.detail for name, o in suite.items() if o.status == ERROR}
    assert set(errors) == set(KNOWN_ERRORS), errors


@pytest.mark.parametrize(
    "case",
    [
        "test_mod_int64_fmod",
        "test_attention_4d_gqa_causal_nonpad_decode_expanded",
        "test_attention_4d_causal_nonpad_batch_prefill_expanded",
        "test_attention_4d_attn_mask_3d_causal_expanded",
        "test_sce_NCd1d2d3_none_no_weight_negative_ii_expanded",
        "test_sce_NCd1d2d3_none_no_weight_negative_ii_log_prob_expanded",
    ],
)
def test_the_wrong_answers_of_issue_10_are_right(suite: dict[str, SuiteOutcome], case: str) -> None:
    assert suite[case].status in (PASS, HOST), suite[case]


def test_random_ops_are_checked_by_support_not_values(suite: dict[str, SuiteOutcome]) -> None:
    bernoulli = [o for o in suite.values() if o.op_type == "Bernoulli"]
    assert bernoulli and all(o.status in (PASS, HOST) and "support" in o.detail for o in bernoulli)


def test_refusals_carry_a_code(suite: dict[str, SuiteOutcome]) -> None:
    refused = [o for o in suite.values() if o.status == REFUSED]
    assert refused and all(o.code for o in refused)
    assert suite["test_scan_sum"].code == "host_op_failed"
    assert suite["test_regex_full_match_basic"].code == "unsupported_dtype"
    assert suite["test_sequence_insert_at_back"].code == "non_tensor_values"


def test_most_of_the_suite_runs_as_generated_kernels(suite: dict[str, SuiteOutcome]) -> None:
    """A floor, not a target: it catches a change that silently sends kernels to the host."""
    passed = sum(1 for o in suite.values() if o.status == PASS)
    assert passed >= 600, format_suite(list(suite.values()), per_op=False)
