"""Run the ONNX backend node conformance cases through the CPU runtime.

The `onnx` package builds its node test cases in memory (`onnx.backend.test.case.node`: one
single-node model plus input and expected output arrays per case). This module keeps the cases of
the ops the registry claims (any kind but opaque) whose data is fp32, compiles each case's model
with the real runtime (`compile_model`: every non-view op becomes a generated kernel) and compares
the outputs with the expected ones.

    cases = collect_cases()                      # claimed ops, float cases
    precompile(cases, cache)                     # every unique kernel, a few compiler runs
    outcomes = [run_case(c, cache) for c in cases]  # each case twice, arena poisoned differently
    print(format_summary(summarize(outcomes)))

A case only *passes* when every node ran as a compiled kernel and matched; a case whose op fell
back to the onnx.reference host path is reported as `host`, because then nothing of ours was
checked. The test (tests/.../test_conformance.py) and a benchmark or CLI share this code.

Operands that real models carry as constants (shapes, axes, pads, repeats, split sizes: the int64
operands of the op) are turned into initializers before compiling: canonicalization does the same
to a real model, and the generators specialise on those values. Operands read per element
(Gather/GatherElements indices, ReverseSequence lengths) stay runtime inputs.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from ...errors import FusionError
from ...ops import OpKind, registered_ops
from .cache import KernelCache
from .codegen import CodegenUnsupported, generate
from .compiler import KernelSource, compile_kernels
from .extract import extract
from .runtime import compile_model, support_sources

RTOL = 1e-5
ATOL = 1e-6
# int64 operands read element by element (data, not parameters): they stay graph inputs.
RUNTIME_INT_OPERANDS: Mapping[str, frozenset[int]] = {
    "Gather": frozenset({1}),
    "GatherElements": frozenset({1}),
    "ReverseSequence": frozenset({1}),
}
# Cases whose expected outputs onnx writes by hand with fewer digits than fp32 carries: the
# tolerance follows the data's precision (our result is checked against the exact value too).
EXPECTED_PRECISION: Mapping[str, tuple[float, float, str]] = {
    "test_averagepool_2d_ceil_last_window_starts_on_pad": (
        1e-3,
        1e-4,
        "expected values are written with 4 decimals (0.1511 for 1.3595/9 = 0.151056)",
    ),
}
_FLOAT = np.dtype(np.float32)
_AUX = (np.dtype(np.int64), np.dtype(np.bool_))

PASS, MISMATCH, HOST, ERROR = "pass", "mismatch", "host", "error"


@dataclass(frozen=True)
class Case:
    """One conformance case, ready for the runtime."""

    name: str
    op_type: str
    model: onnx.ModelProto  # parameter operands already folded into initializers
    inputs: dict[str, np.ndarray]
    expected: dict[str, np.ndarray]


@dataclass(frozen=True)
class Outcome:
    case: str
    op_type: str
    status: str  # pass | mismatch | host | error
    detail: str = ""
    max_abs_error: float = 0.0


@dataclass
class OpRate:
    op_type: str
    passed: int = 0
    gaps: int = 0  # cases listed as known gaps (not passed, not failures)
    total: int = 0
    failed: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.passed / self.total if self.total else 1.0


def claimed_ops() -> frozenset[str]:
    """Default-domain ops the registry says the backend handles (every kind but opaque)."""
    return frozenset(
        op.op_type
        for (domain, _), op in registered_ops().items()
        if domain == "" and op.kind != OpKind.OPAQUE
    )


@lru_cache(maxsize=1)
def _all_node_cases() -> tuple[Any, ...]:
    """Every node case onnx generates (built once per process: importing them runs numpy code)."""
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        with np.errstate(all="ignore"):
            return tuple(collect_testcases())


def _is_float_case(inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> bool:
    """fp32 data, with int64/bool only where the op needs them (indices, parameters, masks).

    The data is fp32 when an output is, or when the first input is (ArgMax, comparisons and
    IsNaN read fp32 and write int64/bool); Trilu or Where over int64 data are integer cases.
    """
    arrays = [*inputs, *outputs]
    if not inputs or not all(a.dtype == _FLOAT or a.dtype in _AUX for a in arrays):
        return False
    return inputs[0].dtype == _FLOAT or any(a.dtype == _FLOAT for a in outputs)


def as_arrays(values: Sequence[object]) -> list[np.ndarray] | None:
    """The case's values as arrays (numpy scalars included); None for sequences or protos."""
    out = []
    for v in values:
        if not isinstance(v, np.ndarray | np.generic):
            return None
        out.append(np.asarray(v))
    return out


def _fold_parameters(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> onnx.ModelProto:
    """Turn the node's int64 parameter operands into initializers (see the module docstring)."""
    node = model.graph.node[0]
    keep = RUNTIME_INT_OPERANDS.get(node.op_type, frozenset())
    folded = {
        name
        for k, name in enumerate(node.input)
        if name and k > 0 and k not in keep and name in feeds and feeds[name].dtype == np.int64
    }
    if not folded:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    inputs = [vi for vi in out.graph.input if vi.name not in folded]
    del out.graph.input[:]
    out.graph.input.extend(inputs)
    out.graph.initializer.extend(numpy_helper.from_array(feeds.pop(n), n) for n in sorted(folded))
    return out


def collect_cases(ops: Iterable[str] | None = None) -> list[Case]:
    """The single-node fp32 cases of `ops` (default: the claimed ops), in onnx's order.

    Function-expanded variants (`*_expanded*`) are left out: they test other ops' composition.
    """
    wanted = frozenset(ops) if ops is not None else claimed_ops()
    cases = []
    for tc in _all_node_cases():
        model = tc.model
        if model is None or "_expanded" in tc.name or len(model.graph.node) != 1:
            continue
        node = model.graph.node[0]
        if node.domain not in ("", "ai.onnx") or node.op_type not in wanted:
            continue
        ins, outs = as_arrays(tc.data_sets[0][0]), as_arrays(tc.data_sets[0][1])
        if ins is None or outs is None or not _is_float_case(ins, outs):
            continue
        feeds = dict(zip([i.name for i in model.graph.input], ins, strict=True))
        expected = {o.name: a for o, a in zip(model.graph.output, outs, strict=True)}
        cases.append(Case(tc.name, node.op_type, _fold_parameters(model, feeds), feeds, expected))
    return cases


def precompile(cases: Sequence[Case], cache: KernelCache, jobs: int | None = None) -> int:
    """Compile every case's kernels in one batch (a few combined units); return how many.

    Cases whose extraction or generation fails are skipped here; `run_case` reports them. A
    compiler failure in the batch is swallowed too: `run_case` then rebuilds that case's kernels
    alone and reports the error against it.
    """
    sources: dict[str, KernelSource] = {}
    for case in cases:
        try:
            plan = extract(case.model)
        except FusionError:
            continue
        for symbol, spec in plan.specs.items():
            if symbol in sources:
                continue
            try:
                kernel = generate(spec)
            except CodegenUnsupported:
                continue
            sources[symbol] = KernelSource(symbol, kernel.source, uses_blas=kernel.uses_blas)
    batch = [*sources.values(), *support_sources()]
    with contextlib.suppress(FusionError):
        compile_kernels(batch, cache=cache, jobs=jobs, combine=True)
    return len(sources)


def _is_narrow_float(dtype: np.dtype) -> bool:
    """bfloat16 and the fp8 types (ml_dtypes: numpy kind 'V') are floats, compared with tolerance."""
    return dtype.kind == "V" and ("float" in dtype.name)


def compare(
    got: np.ndarray, want: np.ndarray, rtol: float = RTOL, atol: float = ATOL
) -> tuple[bool, float, str]:
    """(ok, max abs error, why not) for one output; NaN matches NaN, infinities match exactly."""
    if got.shape != want.shape:
        return False, float("inf"), f"shape {list(got.shape)} != expected {list(want.shape)}"
    if got.dtype != want.dtype:
        return False, float("inf"), f"dtype {got.dtype} != expected {want.dtype}"
    if want.dtype.kind != "f" and not _is_narrow_float(want.dtype):
        bad = int(np.count_nonzero(got != want))
        return bad == 0, float(bad != 0), f"{bad} element(s) differ" if bad else ""
    g, w = got.astype(np.float64), want.astype(np.float64)
    with np.errstate(invalid="ignore"):
        ok = np.isclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
        err = np.where(np.isfinite(g) & np.isfinite(w), np.abs(g - w), 0.0)
    worst = float(err.max()) if err.size else 0.0
    bad = int(np.count_nonzero(~ok))
    return bad == 0, worst, f"{bad}/{ok.size} element(s) off, max abs error {worst:.3g}" if bad else ""


def run_case(
    case: Case,
    cache: KernelCache,
    *,
    rtol: float = RTOL,
    atol: float = ATOL,
    threads: int = 1,
    repeat: int = 2,
) -> Outcome:
    """Compile and run one case `repeat` times; never raises for a failure of the case itself.

    Before each run the arena is poisoned with a different pattern (`CompiledModel.poison`), and
    the runs must agree bit for bit: a kernel reading memory no kernel wrote fails here even when
    the garbage happens to be close to the answer. `EXPECTED_PRECISION` widens the tolerance of
    the few cases whose expected data is rounded.
    """
    if case.name in EXPECTED_PRECISION:
        rtol, atol = max(rtol, EXPECTED_PRECISION[case.name][0]), max(atol, EXPECTED_PRECISION[case.name][1])
    try:
        compiled = compile_model(case.model, cache=cache, threads=threads)
        runs = []
        for seed in range(max(1, repeat)):
            compiled.poison(seed)
            runs.append(compiled.run(case.inputs))
    except Exception as exc:  # a conformance run records every failure of a case
        return Outcome(case.name, case.op_type, ERROR, f"{type(exc).__name__}: {exc}"[:500])
    got = runs[0]
    hosts = compiled.stats["host_ops"]
    worst = 0.0
    problems = []
    for name, want in case.expected.items():
        ok, err, why = compare(got[name], want, rtol, atol)
        worst = max(worst, err)
        if not ok:
            problems.append(f"{name}: {why}")
        if any(
            not np.array_equal(r[name], got[name], equal_nan=got[name].dtype.kind == "f") for r in runs[1:]
        ):
            problems.append(f"{name}: differs between runs on a differently poisoned arena")
    if problems:
        status = MISMATCH
    elif hosts:
        status = HOST
        problems = [f"{h['op_type']} ran on the host: {h['reason']}" for h in hosts]
    else:
        status = PASS
    return Outcome(case.name, case.op_type, status, "; ".join(problems)[:500], worst)


def summarize(outcomes: Iterable[Outcome], known_gaps: Mapping[str, str] | None = None) -> dict[str, OpRate]:
    """Pass counts per op, sorted by op; `known_gaps` cases are counted apart (not as passes)."""
    gaps = known_gaps or {}
    rates: dict[str, OpRate] = {}
    for o in outcomes:
        rate = rates.setdefault(o.op_type, OpRate(o.op_type))
        rate.total += 1
        if o.status == PASS:
            rate.passed += 1
        elif o.case in gaps:
            rate.gaps += 1
        else:
            rate.failed.append(o.case)
    return dict(sorted(rates.items()))


def format_summary(rates: Mapping[str, OpRate]) -> str:
    """One line per op and the overall rate, for a terminal or an assertion message."""
    lines = [f"{'op':<27}{'passed':>7}{'gaps':>6}{'failed':>7}{'cases':>7}{'rate':>8}"]
    for r in rates.values():
        lines.append(f"{r.op_type:<27}{r.passed:>7}{r.gaps:>6}{len(r.failed):>7}{r.total:>7}{r.rate:>8.1%}")
    passed = sum(r.passed for r in rates.values())
    gaps = sum(r.gaps for r in rates.values())
    failed = sum(len(r.failed) for r in rates.values())
    total = sum(r.total for r in rates.values())
    overall = passed / total if total else 1.0
    lines.append(f"{'overall':<27}{passed:>7}{gaps:>6}{failed:>7}{total:>7}{overall:>8.1%}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m graph_autofusion.backend.cpu.conformance [OP ...]`: print the pass rates."""
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("ops", nargs="*", help="op types to run (default: every claimed op)")
    parser.add_argument("--cache", help="kernel cache directory (default: a temporary one)")
    parser.add_argument("--jobs", type=int, default=None, help="parallel compiler runs")
    parser.add_argument("-v", "--verbose", action="store_true", help="list every case that did not pass")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="af-conformance-") as tmp:
        cache = KernelCache(args.cache or tmp)
        cases = collect_cases(args.ops or None)
        precompile(cases, cache, jobs=args.jobs)
        outcomes = [run_case(c, cache) for c in cases]  # each case twice, arena poisoned differently
    print(format_summary(summarize(outcomes)))
    if args.verbose:
        for o in outcomes:
            if o.status != PASS:
                print(f"{o.status:<9}{o.case}: {o.detail}")
    return 0 if all(o.status == PASS for o in outcomes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
