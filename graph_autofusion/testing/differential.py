"""Differential testing: random graphs through fuse + compile + run, judged against onnxruntime.

    verdicts = run_campaign(range(100), KernelCache(tmp), repro_dir=Path("repros"))
    print(format_summary(verdicts))

For each graph (random_graphs.generate) the model is fused twice — with the default config and
with fusion off (`max_fusion_size=0`, every op its own kernel) — both are compiled by the real
CPU backend and run on the graph's inputs, and every output is compared with onnxruntime's
(onnx.reference's where onnxruntime cannot run the model). The outcomes:

    pass      every output of both runs matches, every node ran as a compiled kernel
    host      matches, but some node ran on the onnx.reference host path (nothing of ours checked it)
    refused   fuse() raised a FusionError: a deliberate refusal with a stable code
    wrong     an output differs beyond tolerance: a bug
    crash     any other exception (generator failure, C compiler error, ...): a bug
    disputed  ours differs from the reference but matches the float64 truth, which the reference
              misses; a person decides (the truth comes from onnx.reference, which has bugs too:
              its LogSoftmax before opset 13 follows opset 13)

Tolerance (floats): |ours - ref| <= rtol·|ref| + atol, elementwise, with rtol = 1e-5·f and
atol = max(1e-6·f·S, 8·noise) where S is the largest |ref| of the output (so elements that cancel
to ~0 are judged on the tensor's scale), f = 1 + sqrt(n)/4 grows with the elements n summed
along the output's path (reductions, contractions), and `noise` is how far the reference itself
is from the float64 truth (capped at 1e-3·S): where onnxruntime rounds a lot, so may we. An
output with an fp16 tensor anywhere upstream uses 2e-3 for 1e-5 (and 2e-4·f·S for the atol
floor): onnxruntime's CPU computes some fp16 ops in fp32, onnx.reference in fp16. Integer and
bool outputs must match exactly.

A failing graph is shrunk (the smallest cut of the graph down to one output that still fails),
saved as `<repro_dir>/diff_<seed>.onnx` with its inputs in `diff_<seed>.npz`, and the verdict
names both paths and the seed (`generate(seed)` rebuilds the whole graph).
"""

from __future__ import annotations

import contextlib
import io
import math
import platform
import re
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from ..api import FusedGraph, fuse
from ..backend.cpu.hostops import reference_evaluator
from ..config import FusionConfig
from ..errors import CompilationError, FusionError
from .random_graphs import RandomGraph, generate

PASS, HOST, REFUSED, WRONG, CRASH, DISPUTED = "pass", "host", "refused", "wrong", "crash", "disputed"
STATUSES = (PASS, HOST, REFUSED, DISPUTED, WRONG, CRASH)
RTOL = 1e-5
RTOL_FP16 = 2e-3
ATOL_SCALE = 1e-6
NOISE_FACTOR = 8.0
NOISE_CAP = 1e-3
VARIANTS = ("fused", "unfused")


@dataclass(frozen=True)
class Verdict:
    """The outcome of one graph."""

    seed: int
    opset: int
    ops: tuple[str, ...]
    status: str
    detail: str = ""
    ratio: float = 0.0  # worst |ours - ref| / tolerance over outputs (> 1 is wrong)
    code: str = ""  # the FusionError code of a refusal
    repro: str = ""  # path of the minimal repro model, for wrong and crash
    seconds: float = 0.0
    host_reasons: tuple[str, ...] = ()  # why nodes ran on the host (as the runtime says)

    def line(self) -> str:
        where = f" repro={self.repro}" if self.repro else ""
        return (
            f"{self.status:<8} seed={self.seed} opset={self.opset} ops={'>'.join(self.ops)}"
            f"{where}: {self.detail}"
        )


@dataclass
class Prepared:
    """A graph fused both ways (or the verdict that stopped it)."""

    graph: RandomGraph
    models: dict[str, FusedGraph]
    stopped: Verdict | None = None


def _base(graph: RandomGraph, status: str, detail: str = "", **kw: Any) -> Verdict:
    return Verdict(graph.seed, graph.opset, graph.ops, status, detail[:600], **kw)


def prepare(graph: RandomGraph) -> Prepared:
    """Fuse the graph with the default config and with fusion off."""
    models: dict[str, FusedGraph] = {}
    configs = {"fused": FusionConfig(), "unfused": FusionConfig(max_fusion_size=0)}
    for variant, config in configs.items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                models[variant] = fuse(graph.model, config)
        except FusionError as exc:
            return Prepared(graph, models, _base(graph, REFUSED, f"{variant}: {exc}", code=exc.code))
        except Exception as exc:  # anything but a refusal is a bug of ours
            return Prepared(graph, models, _base(graph, CRASH, f"fuse ({variant}): {_why(exc)}"))
    return Prepared(graph, models)


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".replace("\n", " ")


def precompile(prepared: Iterable[Prepared], cache: Any, jobs: int | None = None) -> int:
    """Compile every unique kernel of every prepared graph in one batch; return how many.

    A few combined compiler runs are far cheaper than one per graph. Failures are left for
    `check` to report against the graph at fault.
    """
    from ..backend.cpu.codegen import CodegenUnsupported
    from ..backend.cpu.codegen import generate as generate_kernel
    from ..backend.cpu.compiler import KernelSource, compile_kernels
    from ..backend.cpu.extract import extract
    from ..backend.cpu.runtime import support_sources

    sources: dict[str, KernelSource] = {}
    for p in prepared:
        for fg in p.models.values():
            try:
                plan = extract(fg.model)
            except Exception:  # reported by check()
                continue
            for symbol, spec in plan.specs.items():
                if symbol in sources:
                    continue
                try:
                    kernel = generate_kernel(spec)
                except CodegenUnsupported:
                    continue
                except Exception:  # reported by check()
                    continue
                sources[symbol] = KernelSource(symbol, kernel.source, uses_blas=kernel.uses_blas)
    batch = [*sources.values(), *support_sources()]
    with contextlib.suppress(FusionError):
        compile_kernels(batch, cache=cache, jobs=jobs, combine=True)
    return len(sources)


# -- references -----------------------------------------------------------------------------------
def reference_outputs(graph: RandomGraph) -> tuple[dict[str, np.ndarray], str]:
    """onnxruntime's outputs (no graph optimizations), else onnx.reference's; and which ran."""
    import onnxruntime as ort

    try:
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        opts.intra_op_num_threads = 1
        opts.log_severity_level = 4
        session = ort.InferenceSession(
            graph.model.SerializeToString(), opts, providers=["CPUExecutionProvider"]
        )
        values = session.run(None, graph.inputs)
        return dict(zip(graph.output_names, values, strict=True)), "onnxruntime"
    except Exception:  # onnxruntime lacks the op (or the type): the ONNX reference evaluator
        with warnings.catch_warnings(), np.errstate(all="ignore"), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            values = reference_evaluator(graph.model).run(None, graph.inputs)
        return dict(zip(graph.output_names, (np.asarray(v) for v in values), strict=True)), "onnx.reference"


def tolerance(
    ref: np.ndarray, truth: np.ndarray, accumulated: int, base: float = RTOL
) -> tuple[np.ndarray, float]:
    """Elementwise tolerance for a float output and the reference's own noise (module docstring).

    `base` is the relative rounding of the coarsest float type on the output's path (RTOL for
    fp32, RTOL_FP16 when an fp16 tensor feeds it)."""
    r = ref.astype(np.float64)
    f = 1.0 + math.sqrt(max(0, accumulated)) / 4.0
    finite = np.isfinite(r)
    scale = float(np.max(np.abs(r[finite]))) if finite.any() else 0.0
    both = finite & np.isfinite(truth)
    noise = float(np.max(np.abs(r - truth)[both])) if both.any() else 0.0
    noise = min(noise, NOISE_CAP * scale)
    base = max(base, RTOL_FP16 if ref.dtype == np.float16 else RTOL)
    atol = max(ATOL_SCALE * (base / RTOL) * f * scale, NOISE_FACTOR * noise, 1e-30)
    return base * f * np.abs(np.where(finite, r, 0.0)) + atol, noise


def judge(
    got: np.ndarray, ref: np.ndarray, truth: np.ndarray, accumulated: int, base: float = RTOL
) -> tuple[bool, float, str]:
    """(ok, worst error / tolerance, why not) for one output. NaN matches NaN, inf matches inf."""
    got = np.asarray(got)
    if got.shape != ref.shape:
        return False, math.inf, f"shape {list(got.shape)} != {list(ref.shape)}"
    if got.dtype != ref.dtype:
        return False, math.inf, f"dtype {got.dtype} != {ref.dtype}"
    if ref.dtype.kind != "f":
        bad = got != ref
        n = int(np.count_nonzero(bad))
        if not n:
            return True, 0.0, ""
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        return False, math.inf, f"{n}/{ref.size} differ, e.g. at {list(at)}: {got[at]} vs {ref[at]}"
    tol, noise = tolerance(ref, truth, accumulated, base)
    g, r = got.astype(np.float64), ref.astype(np.float64)
    with np.errstate(invalid="ignore"):
        err = np.abs(g - r)
        same = (np.isnan(g) & np.isnan(r)) | (g == r)  # NaN vs NaN, inf vs inf of one sign
        ratio = np.where(same, 0.0, np.where(np.isnan(err), np.inf, err / tol))
    worst = float(np.max(ratio)) if ratio.size else 0.0
    if worst <= 1.0:
        return True, worst, ""
    at = tuple(int(i) for i in np.unravel_index(int(np.argmax(ratio)), ratio.shape))
    n = int(np.count_nonzero(ratio > 1.0))
    return (
        False,
        worst,
        (
            f"{n}/{ref.size} off, max abs error {float(np.max(np.where(same, 0.0, err))):.3g} at {list(at)}: "
            f"{float(g[at]):.8g} vs {float(r[at]):.8g} (truth {float(truth[at]):.8g}, "
            f"tolerance {float(tol[at]):.3g}, reference noise {noise:.3g})"
        ),
    )


# -- one graph ------------------------------------------------------------------------------------
def check(
    graph: RandomGraph,
    cache: Any,
    *,
    threads: int = 1,
    prepared: Prepared | None = None,
    reference: tuple[dict[str, np.ndarray], str] | None = None,
) -> Verdict:
    """Fuse, compile and run one graph both ways and judge it (never raises for the graph)."""
    from ..backend.cpu.runtime import compile_model

    started = time.perf_counter()
    p = prepared if prepared is not None else prepare(graph)
    if p.stopped is not None:
        return replace(p.stopped, seconds=time.perf_counter() - started)
    try:
        refs, source = reference if reference is not None else reference_outputs(graph)
    except Exception as exc:  # neither reference runs the graph: the generator drew a bad one
        return _base(graph, CRASH, f"reference: {_why(exc)}")
    problems: list[str] = []
    disputed: list[str] = []
    hosts: list[str] = []
    reasons: set[str] = set()
    worst = 0.0
    for variant in VARIANTS:
        try:
            compiled = compile_model(p.models[variant].model, cache=cache, threads=threads)
            got = compiled.run(graph.inputs)
        except CompilationError as exc:
            return _base(graph, CRASH, f"{variant}: {_why(exc)}", seconds=time.perf_counter() - started)
        except FusionError as exc:
            seconds = time.perf_counter() - started
            return _base(graph, REFUSED, f"{variant} runtime: {exc}", code=exc.code, seconds=seconds)
        except Exception as exc:  # a bug of ours
            return _base(graph, CRASH, f"{variant}: {_why(exc)}", seconds=time.perf_counter() - started)
        hosts += [f"{h['op_type']} ({h['reason']})" for h in compiled.stats["host_ops"]]
        reasons.update(h["reason"] for h in compiled.stats["host_ops"])
        for name, ref in refs.items():
            truth = graph.truth[name]
            acc, base = graph.accumulation.get(name, 0), graph.rtol.get(name, RTOL)
            ok, ratio, why = judge(got[name], ref, truth, acc, base)
            worst = max(worst, ratio)
            if ok:
                continue
            if _matches_truth(got[name], ref, truth, acc, base):
                disputed.append(f"{variant} {name}: {source} is off the float64 truth: {why}")
            else:
                problems.append(f"{variant} {name} vs {source}: {why}")
    seconds = time.perf_counter() - started
    if problems:
        return _base(graph, WRONG, "; ".join(problems), ratio=worst, seconds=seconds)
    if disputed:
        return _base(graph, DISPUTED, "; ".join(disputed), ratio=worst, seconds=seconds)
    if hosts:
        return _base(
            graph,
            HOST,
            "; ".join(sorted(set(hosts))),
            ratio=worst,
            seconds=seconds,
            host_reasons=tuple(sorted(reasons)),
        )
    return _base(graph, PASS, ratio=worst, seconds=seconds)


def _matches_truth(
    got: np.ndarray, ref: np.ndarray, truth: np.ndarray, accumulated: int, base: float
) -> bool:
    """Does ours match the float64 truth where the reference does not (the reference is wrong)?"""
    if got.shape != truth.shape:
        return False
    if ref.dtype.kind != "f":
        return bool(np.array_equal(got, truth.astype(got.dtype)))
    as_ref = truth.astype(ref.dtype)
    tol, _ = tolerance(as_ref, truth, accumulated, base)
    return bool(np.all(np.abs(got.astype(np.float64) - truth) <= tol))


def shrink(graph: RandomGraph, cache: Any, status: str, *, threads: int = 1) -> RandomGraph:
    """The smallest cut of `graph` (ancestors of one tensor) that still ends with `status`."""
    producers = [o for n in graph.model.graph.node for o in n.output]
    cuts = []
    for name in producers:
        try:
            cuts.append(graph.subgraph(name))
        except Exception:  # a cut that does not check is no repro
            continue
    cuts.sort(key=lambda g: len(g.model.graph.node))
    for cut in cuts:
        if len(cut.model.graph.node) >= len(graph.model.graph.node):
            break
        if check(cut, cache, threads=threads).status == status:
            return cut
    return graph


def save_repro(graph: RandomGraph, directory: Path) -> Path:
    """Write the model and its inputs (`.npz`) and return the model's path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"diff_{graph.seed}.onnx"
    onnx.save_model(graph.model, path)
    np.savez(path.with_suffix(".npz"), **graph.inputs)
    return path


# -- campaigns ------------------------------------------------------------------------------------
def run_campaign(
    seeds: Iterable[int],
    cache: Any,
    *,
    jobs: int | None = None,
    threads: int = 1,
    repro_dir: Path | None = None,
    batch: int = 50,
    avoid_known_bugs: bool = True,
    progress: Callable[[Verdict], None] | None = None,
) -> list[Verdict]:
    """Generate, precompile (in batches) and check every seed's graph; shrink and save failures."""
    verdicts: list[Verdict] = []
    seeds = list(seeds)
    for start in range(0, len(seeds), batch):
        graphs: list[RandomGraph | Verdict] = []
        for seed in seeds[start : start + batch]:
            try:
                graphs.append(generate(seed, avoid_known_bugs=avoid_known_bugs))
            except Exception as exc:  # the generator itself failed: report, do not stop
                graphs.append(Verdict(seed, 0, (), CRASH, f"generator: {_why(exc)}"))
        prepared = {g.seed: prepare(g) for g in graphs if isinstance(g, RandomGraph)}
        precompile(prepared.values(), cache, jobs=jobs)
        for g in graphs:
            if isinstance(g, Verdict):
                verdict = g
            else:
                verdict = check(g, cache, threads=threads, prepared=prepared[g.seed])
                if verdict.status in (WRONG, CRASH) and repro_dir is not None:
                    small = shrink(g, cache, verdict.status, threads=threads)
                    path = save_repro(small, repro_dir)
                    note = f" [minimal: {'>'.join(small.ops)}]" if small is not g else ""
                    verdict = replace(verdict, repro=str(path), detail=verdict.detail + note)
            verdicts.append(verdict)
            if progress is not None:
                progress(verdict)
    return verdicts


def counts(verdicts: Iterable[Verdict]) -> dict[str, int]:
    found = Counter(v.status for v in verdicts)
    return {s: found.get(s, 0) for s in STATUSES}


def per_op(verdicts: Iterable[Verdict]) -> dict[str, Counter[str]]:
    """For each op type: how many graphs containing it ended in each status."""
    table: dict[str, Counter[str]] = {}
    for v in verdicts:
        for op in set(v.ops):
            table.setdefault(op, Counter())[v.status] += 1
    return dict(sorted(table.items()))


def host_header() -> str:
    """CPU model and ISA (`hardware.describe_host`) and Python: results differ between hosts."""
    from ..hardware import describe_host

    return f"{describe_host()} | python {platform.python_version()}"


def _host_reason(reason: str) -> str:
    """A host reason without node, kernel or tensor names, so that reasons group."""
    return re.sub(r"'[^']*'|\b(?:fused|af)_\w+", "…", reason)[:100]


def format_summary(verdicts: Sequence[Verdict], *, ops: bool = True) -> str:
    """Counts per outcome, then per op (graphs containing the op), then every failure's line."""
    c = counts(verdicts)
    lines = ["outcomes: " + "  ".join(f"{s}={n}" for s, n in c.items()) + f"  total={len(verdicts)}"]
    refused = Counter(v.code for v in verdicts if v.status == REFUSED)
    if refused:
        lines.append("refused by code: " + ", ".join(f"{k}={n}" for k, n in refused.most_common()))
    hosts = Counter(
        r for v in verdicts if v.status == HOST for r in {_host_reason(x) for x in v.host_reasons}
    )
    if hosts:
        lines.append("host ops by reason (graphs):")
        lines.extend(f"  {n:>5}  {reason}" for reason, n in hosts.most_common(12))
    if ops:
        lines.append(f"{'op':<28}" + "".join(f"{s:>9}" for s in STATUSES))
        for op, row in per_op(verdicts).items():
            lines.append(f"{op:<28}" + "".join(f"{row.get(s, 0):>9}" for s in STATUSES))
    for v in verdicts:
        if v.status in (WRONG, CRASH, DISPUTED):
            lines.append(v.line())
    return "\n".join(lines)


def failures(verdicts: Iterable[Verdict], statuses: Sequence[str] = (WRONG, CRASH)) -> list[Verdict]:
    return [v for v in verdicts if v.status in statuses]


__all__ = [
    "Prepared",
    "Verdict",
    "check",
    "counts",
    "format_summary",
    "host_header",
    "judge",
    "per_op",
    "precompile",
    "prepare",
    "reference_outputs",
    "run_campaign",
    "save_repro",
    "shrink",
    "tolerance",
]
