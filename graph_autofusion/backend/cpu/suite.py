"""The whole ONNX node suite through the public path: `fuse` the case's model, compile, run.

`conformance.py` checks the generators op by op (fp32 cases of claimed ops, compiled directly).
This module asks the question a user asks: for *every* case onnx ships — every op, every dtype,
the `_expanded` function bodies too — does `graph_autofusion.fuse(model)` followed by the compiled
runtime give the expected outputs? Each case ends in exactly one status:

* `pass`     every output matches and every node ran as a generated kernel;
* `host`     every output matches, but some node ran on the host path (onnx.reference);
* `wrong`    an output differs from the expected one (the status that must stay at zero);
* `refused`  the engine declined with a stable `FusionError` code (or the case's values are not
             tensors: sequences, optionals), which a user sees as an error, never a wrong answer;
* `error`    anything else (a crash of the engine: a bug to look at).

    cases = suite_cases()
    outcomes = run_suite(cases, cache, repeat=2)
    print(format_suite(outcomes))

`repeat` runs each case that many times with a freshly poisoned arena between runs (see
`CompiledModel.poison`): outputs that change between identical runs read memory no kernel wrote,
and such a case counts as `wrong`. The tolerance is the case's own (onnx's backend-test rtol/atol).
"""

from __future__ import annotations

import contextlib
import io
import re
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from ...errors import FusionError
from .cache import KernelCache
from .codegen import generate
from .compiler import KernelSource, compile_kernels
from .conformance import _all_node_cases, as_arrays, compare
from .extract import extract
from .runtime import compile_model, support_sources

PASS, HOST, WRONG, REFUSED, ERROR = "pass", "host", "wrong", "refused", "error"
# 16-bit float outputs: the expected values (onnx.reference running the expanded function) round
# every intermediate to 16 bits, a kernel computes in fp32 and rounds once at its outputs, so the
# two differ by an ulp or two; the floor is 4 machine epsilons of the type (2^-10 fp16, 2^-7 bf16).
NARROW_FLOAT_RTOL: dict[str, float] = {"float16": 4 * 2.0**-10, "bfloat16": 4 * 2.0**-7}
# Ops whose outputs are random draws: no implementation reproduces onnx's numpy generator, so their
# cases check what is fixed — shape, dtype and that every value lies in the support — not values.
RANDOM_SUPPORT: dict[str, tuple[float, ...] | None] = {
    "Bernoulli": (0.0, 1.0),
    "RandomNormal": None,
    "RandomNormalLike": None,
    "RandomUniform": None,
    "RandomUniformLike": None,
    "Multinomial": None,
}
STATUSES = (PASS, HOST, WRONG, REFUSED, ERROR)
_EXPANDED = re.compile(r"_expanded.*$")


@dataclass(frozen=True)
class SuiteCase:
    """One node-suite case as shipped: the model untouched, its first data set."""

    name: str
    op_type: str  # the op the case is about (for `_expanded` cases: the op it expands)
    model: onnx.ModelProto
    inputs: dict[str, np.ndarray]
    expected: dict[str, np.ndarray]
    rtol: float
    atol: float
    not_tensors: str = ""  # why the values are not plain arrays (then the case is refused)


@dataclass(frozen=True)
class SuiteOutcome:
    case: str
    op_type: str
    status: str
    code: str = ""  # the refusal code, or the exception type of an error
    detail: str = ""
    max_abs_error: float = 0.0


def suite_cases(names: Iterable[str] | None = None) -> list[SuiteCase]:
    """Every node case onnx generates (or those whose op or case name is in `names`), in order."""
    raw = _all_node_cases()
    op_of: dict[str, str] = {}
    for tc in raw:
        if "_expanded" not in tc.name and tc.model is not None and len(tc.model.graph.node) == 1:
            op_of[tc.name] = tc.model.graph.node[0].op_type
    wanted = frozenset(names) if names is not None else None
    cases = []
    for tc in raw:
        model = tc.model
        base = _EXPANDED.sub("", tc.name)
        op_type = op_of.get(base) or (model.graph.node[0].op_type if model.graph.node else "?")
        if wanted is not None and not ({op_type, tc.name} & wanted):
            continue
        ins, outs = tc.data_sets[0]
        in_arrays, out_arrays = as_arrays(ins), as_arrays(outs)
        if in_arrays is None or out_arrays is None:
            cases.append(
                SuiteCase(tc.name, op_type, model, {}, {}, tc.rtol, tc.atol, "sequence or optional values")
            )
            continue
        feeds = {vi.name: a for vi, a in zip(model.graph.input, in_arrays, strict=False)}
        expected = {vi.name: a for vi, a in zip(model.graph.output, out_arrays, strict=False)}
        cases.append(SuiteCase(tc.name, op_type, model, feeds, expected, tc.rtol, tc.atol))
    return cases


def _fuse(case: SuiteCase) -> Any:
    from ...api import fuse

    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        return fuse(case.model)


def precompile_fused(models: Iterable[onnx.ModelProto], cache: KernelCache, jobs: int | None = None) -> int:
    """Build every kernel of `models` in a few combined compiler runs (later loads hit the cache)."""
    sources: dict[str, KernelSource] = {}
    for model in models:
        try:
            plan = extract(model)
        except Exception:  # the case's own run reports it, with its status
            continue
        for symbol, spec in plan.specs.items():
            if symbol in sources:
                continue
            try:
                kernel = generate(spec)
            except Exception:  # unsupported, or a generator crash: the case's own run reports it
                continue
            sources[symbol] = KernelSource(symbol, kernel.source, uses_blas=kernel.uses_blas)
    batch = [*sources.values(), *support_sources()]
    with contextlib.suppress(FusionError):
        compile_kernels(batch, cache=cache, jobs=jobs, combine=True)
    return len(sources)


def _outcome(
    case: SuiteCase, status: str, code: str = "", detail: str = "", err: float = 0.0
) -> SuiteOutcome:
    return SuiteOutcome(case.name, case.op_type, status, code, detail[:400], err)


def run_fused_case(case: SuiteCase, fused: Any, cache: KernelCache, *, repeat: int = 1) -> SuiteOutcome:
    """Compile and run one fused case `repeat` times (poisoned arena between runs); classify it."""
    try:
        compiled = compile_model(fused.model, cache=cache, threads=1)
        runs = []
        for k in range(max(1, repeat)):
            compiled.poison(k)
            with np.errstate(all="ignore"):
                runs.append(compiled.run(case.inputs))
    except FusionError as exc:
        return _outcome(case, REFUSED, exc.code, exc.message)
    except Exception as exc:  # anything else is an engine crash: recorded, the suite goes on
        return _outcome(case, ERROR, type(exc).__name__, str(exc))
    if case.op_type in RANDOM_SUPPORT:
        return _random_outcome(case, compiled, runs[0])
    worst = 0.0
    problems = []
    for name, want in case.expected.items():
        got = runs[0].get(name)
        if got is None:
            problems.append(f"{name}: missing output")
            continue
        rtol = max(case.rtol, NARROW_FLOAT_RTOL.get(want.dtype.name, 0.0))
        ok, err, why = compare(got, want, rtol, case.atol)
        worst = max(worst, err)
        if not ok:
            problems.append(f"{name}: {why}")
        for again in runs[1:]:
            if not np.array_equal(again[name], got, equal_nan=got.dtype.kind in "fc"):
                problems.append(f"{name}: differs between identical runs (a read of unwritten memory)")
                break
    if problems:
        return _outcome(case, WRONG, "", "; ".join(problems), worst)
    hosts = compiled.stats["host_ops"]
    if hosts:
        detail = "; ".join(f"{h['op_type']}: {h['reason']}" for h in hosts)
        return _outcome(case, HOST, hosts[0]["op_type"], detail, worst)
    return _outcome(case, PASS, "", "", worst)


def _random_outcome(case: SuiteCase, compiled: Any, got: dict[str, np.ndarray]) -> SuiteOutcome:
    """A random op's case: shape, dtype and support (see RANDOM_SUPPORT), never the values."""
    support = RANDOM_SUPPORT[case.op_type]
    problems = []
    for name, want in case.expected.items():
        value = got.get(name)
        if value is None or value.shape != want.shape or value.dtype != want.dtype:
            problems.append(
                f"{name}: shape/dtype {getattr(value, 'shape', None)} {getattr(value, 'dtype', None)}"
            )
        elif support is not None and not np.isin(value, support).all():
            problems.append(f"{name}: values outside {support}")
    if problems:
        return _outcome(case, WRONG, "", "; ".join(problems))
    hosts = compiled.stats["host_ops"]
    note = "random draws: shape, dtype and support checked, not values"
    if hosts:
        return _outcome(case, HOST, hosts[0]["op_type"], note)
    return _outcome(case, PASS, "", note)


def run_suite(
    cases: Sequence[SuiteCase],
    cache: KernelCache,
    *,
    repeat: int = 1,
    jobs: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[SuiteOutcome]:
    """Fuse every case, build all kernels in one batch, then run and classify each case."""
    fused: dict[str, Any] = {}
    early: dict[str, SuiteOutcome] = {}
    for case in cases:
        if case.not_tensors:
            early[case.name] = _outcome(case, REFUSED, "non_tensor_values", case.not_tensors)
            continue
        try:
            fused[case.name] = _fuse(case)
        except FusionError as exc:
            early[case.name] = _outcome(case, REFUSED, exc.code, exc.message)
        except Exception as exc:  # an engine crash: recorded, the suite goes on
            early[case.name] = _outcome(case, ERROR, type(exc).__name__, str(exc))
    precompile_fused((f.model for f in fused.values()), cache, jobs=jobs)
    outcomes = []
    for k, case in enumerate(cases):
        outcome = early.get(case.name) or run_fused_case(case, fused[case.name], cache, repeat=repeat)
        outcomes.append(outcome)
        if progress is not None:
            progress(k + 1, len(cases))
    return outcomes


def format_suite(outcomes: Sequence[SuiteOutcome], *, per_op: bool = True) -> str:
    """A table per op (when asked) and the overall counts, then every wrong answer by name."""
    by_op: dict[str, Counter[str]] = {}
    for o in outcomes:
        by_op.setdefault(o.op_type, Counter())[o.status] += 1
    head = f"{'op':<34}" + "".join(f"{s:>9}" for s in STATUSES) + f"{'cases':>8}"
    lines = [head]
    if per_op:
        for op, counts in sorted(by_op.items()):
            lines.append(
                f"{op:<34}" + "".join(f"{counts[s]:>9}" for s in STATUSES) + f"{sum(counts.values()):>8}"
            )
    total = Counter(o.status for o in outcomes)
    lines.append(f"{'overall':<34}" + "".join(f"{total[s]:>9}" for s in STATUSES) + f"{len(outcomes):>8}")
    refusals = Counter(o.code for o in outcomes if o.status == REFUSED)
    if refusals:
        lines.append("refused by code: " + ", ".join(f"{c} {n}" for c, n in refusals.most_common()))
    hosts = Counter(o.code for o in outcomes if o.status == HOST)
    if hosts:
        lines.append("host ops: " + ", ".join(f"{c} {n}" for c, n in hosts.most_common()))
    errors = Counter(o.code for o in outcomes if o.status == ERROR)
    if errors:
        lines.append("errors: " + ", ".join(f"{c} {n}" for c, n in errors.most_common()))
    for o in outcomes:
        if o.status == WRONG:
            lines.append(f"WRONG {o.case}: {o.detail}")
    return "\n".join(lines)
