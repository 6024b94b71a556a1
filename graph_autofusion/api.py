"""The library surface: `fuse(model)`, `Fuser` and the `FusedGraph` they return."""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from .canonicalize import canonicalize
from .config import FusionConfig, PatternSpec
from .errors import InvalidConfigError, UnsupportedModelError, VerificationError
from .export import DOMAIN, export
from .hardware import get_profile
from .ir import Graph
from .limits import check_activation_bytes, check_input_bytes
from .loader import load_model
from .plan import DeclarativePattern, Pattern, Plan, plan
from .report import build_report
from .verify import VerificationResult, run_onnxruntime, verify

Progress = Callable[[str, int | None, int | None], None]
ModelSource = str | os.PathLike[str] | bytes | onnx.ModelProto


class FusedGraph:
    """A fused model plus everything known about how it was made.

    `model` is plain ONNX (fused groups are `ai.graph_autofusion` nodes defined by model-local
    functions), so it can be saved and run anywhere; calling the object compiles its kernels for
    the host CPU on first use and runs them.
    """

    def __init__(
        self,
        *,
        model: onnx.ModelProto,
        source: onnx.ModelProto,
        canonical: onnx.ModelProto,
        plan: Plan,
        report: dict[str, Any],
    ) -> None:
        self.model = model
        self.source = source
        self.canonical = canonical
        self.plan = plan
        self._report = report
        self._compiled: Any = None
        self._targets: dict[str, Any] = {}  # accelerator target -> its compiled model

    # -- statistics ------------------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        return copy.deepcopy(self._report)

    def get_fusion_count(self) -> int:
        """Fused groups: nodes of domain ai.graph_autofusion (each stands for several ops)."""
        return sum(1 for n in self.model.graph.node if n.domain == DOMAIN)

    def get_kernel_count(self) -> int:
        """Kernels the fused model runs; view ops (Reshape, Squeeze, ...) are not kernels."""
        return self._report["kernels"]["after"]

    def get_operator_count(self) -> int:
        """ONNX operators of the canonical graph that the kernels execute."""
        return self._report["operators"]["canonical"]

    def save(self, path: str | os.PathLike[str]) -> Path:
        path = Path(path)
        onnx.save_model(self.model, path)
        return path

    # -- running ---------------------------------------------------------------------------
    def compile(
        self,
        *,
        target: str = "cpu",
        cache_dir: str | os.PathLike[str] | None = None,
        threads: int | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> Any:
        """Generate and compile the kernels for `target`; cached by content, so cheap when repeated.

        `cpu` (the default) compiles C for the host; `cuda` and `ascend910` render Triton kernels
        (docs/targets.md) and return a model that runs on the device, or in Triton's CPU
        interpreter under TRITON_INTERPRET=1. Either way the result is called with numpy inputs.
        """
        if target != "cpu":
            return self._compile_triton(target, cache_dir)
        from .backend.cpu.cache import KernelCache
        from .backend.cpu.runtime import compile_model

        cache = KernelCache(Path(cache_dir)) if cache_dir is not None else None
        compiled = compile_model(self.model, cache=cache, threads=threads, progress=progress)
        # The compiled model has the last word on what runs on the host (it is what will run);
        # it asks the same generators fusion asked, so a strict config was already enforced.
        self._report["host_ops"] = list(compiled.stats["host_ops"])
        self._compiled = compiled
        return self._compiled

    def _compile_triton(self, target: str, cache_dir: str | os.PathLike[str] | None) -> Any:
        from .backend.triton import compile_triton

        compiled = compile_triton(self.model, target=target, cache_dir=cache_dir)
        hosts = list(compiled.stats["host_ops"])
        refuse_host_ops(hosts, FusionConfig.model_validate(self._report.get("config", {})))
        targets = self._report.setdefault("targets", {})
        targets[target] = {"host_ops": hosts, "kernels": compiled.stats["kernels"], "mode": compiled.mode}
        self._targets[target] = compiled
        return compiled

    def __call__(self, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        if self._compiled is None:
            self.compile()
        return self._compiled.run(inputs)

    def save_bundle(self, path: str | os.PathLike[str]) -> Path:
        if self._compiled is None:
            self.compile()
        return self._compiled.save_bundle(path)

    def verify(
        self,
        inputs: Mapping[str, np.ndarray] | None = None,
        *,
        rtol: float | None = None,
        atol: float | None = None,
        runner: str = "runtime",
        raise_on_failure: bool = False,
        target: str = "cpu",
    ) -> VerificationResult:
        """Run the source model in onnxruntime and the fused one (compiled kernels by default,
        or `runner="onnxruntime"`) on the same inputs; report each output's error against its
        tolerance. `target` picks whose compiled kernels run (`cuda`/`ascend910`: the Triton ones,
        compiled on first use).

        By default each output's tolerance is derived from its scale and the roundings that feed
        it (graph_autofusion.verify explains the rule), so a deep model's correct result passes
        and a wrong one does not; `rtol`/`atol` replace that with a fixed |d| ≤ atol + rtol·|ref|.
        """
        if runner == "onnxruntime":
            run = lambda feeds: run_onnxruntime(self.model, feeds)  # noqa: E731
        elif runner == "runtime" and target != "cpu":
            compiled = self._targets.get(target) or self.compile(target=target)
            run = compiled.run
        elif runner == "runtime":
            run = self.__call__
        else:
            raise InvalidConfigError(
                f"unknown runner {runner!r}; use 'runtime' or 'onnxruntime'", code="invalid_runner"
            )
        result = verify(
            self.canonical_reference,
            run,
            inputs=inputs,
            rtol=rtol,
            atol=atol,
            noise_model=self.canonical,
            runner=runner,
        )
        if raise_on_failure and not result.passed:
            raise VerificationError(
                "the fused model disagrees with onnxruntime: "
                + ", ".join(
                    f"{o.name} max abs error {o.max_abs:.3g}, {o.worst_ratio:.3g}x its tolerance"
                    for o in result.outputs
                    if not o.passed
                ),
                result=result.to_dict(),
            )
        return result

    @property
    def canonical_reference(self) -> onnx.ModelProto:
        """The source model with symbolic dims bound — what onnxruntime runs as the reference."""
        return self.canonical if _has_symbolic_inputs(self.source) else self.source

    def __repr__(self) -> str:
        r = self._report
        return (
            f"FusedGraph(operators={r['operators']['canonical']}, kernels={r['kernels']['before']}→"
            f"{r['kernels']['after']}, fusions={r['fusions']}, strategy={r['strategy']!r})"
        )


def _has_symbolic_inputs(model: onnx.ModelProto) -> bool:
    return any(not d.HasField("dim_value") for vi in model.graph.input for d in vi.type.tensor_type.shape.dim)


class Fuser:
    """A configured fusion pipeline: `Fuser().config.cost_model = "latency"`, register patterns, fuse."""

    def __init__(self, config: FusionConfig | Mapping[str, Any] | None = None) -> None:
        self.config = _as_config(config)
        self._patterns: list[Pattern] = []

    def register_pattern(self, pattern: Pattern | PatternSpec | Mapping[str, Any]) -> Pattern:
        if isinstance(pattern, Pattern):
            found = pattern
        elif isinstance(pattern, PatternSpec):
            found = DeclarativePattern(pattern)
        elif isinstance(pattern, Mapping):
            found = DeclarativePattern(PatternSpec.model_validate(pattern))
        else:
            raise InvalidConfigError(
                f"cannot register {type(pattern).__name__} as a pattern", code="invalid_pattern"
            )
        self._patterns.append(found)
        return found

    @property
    def patterns(self) -> list[Pattern]:
        return list(self._patterns)

    def fuse(self, model: ModelSource, *, progress: Progress | None = None) -> FusedGraph:
        config = self.config
        report_progress = progress or (lambda stage, done=None, total=None: None)
        timings: dict[str, float] = {}
        t = time.perf_counter()

        def lap(stage: str) -> None:
            nonlocal t
            now = time.perf_counter()
            timings[stage] = now - t
            t = now

        report_progress("loading", None, None)
        source = load_model(model, config)
        lap("load")
        check_input_bytes(source, config)  # canonicalization may run the model to measure shapes
        report_progress("canonicalizing", None, None)
        canonical, counts = canonicalize(source, config)
        lap("canonicalize")
        graph = Graph(canonical)
        check_activation_bytes(graph, config)  # before planning, compiling or any allocation
        report_progress("planning", None, None)
        hw = get_profile(config.hardware)
        patterns = [*self._patterns, *(DeclarativePattern(p) for p in config.patterns)]
        the_plan = plan(graph, config, hw, patterns)
        lap("plan")
        report_progress("exporting", None, None)
        fused = export(graph, the_plan)
        lap("export")
        hosts = host_ops(fused)
        refuse_host_ops(hosts, config)
        lap("host_ops")
        timings["total"] = sum(timings.values())
        report = build_report(
            original_nodes=len(source.graph.node),
            graph=graph,
            plan=the_plan,
            config=config,
            hw=hw,
            canonicalize_counts=counts,
            timings=timings,
            host_ops=hosts,
        )
        return FusedGraph(model=fused, source=source, canonical=canonical, plan=the_plan, report=report)


def host_ops(model: onnx.ModelProto) -> list[dict[str, Any]]:
    """Every op of the fused model the CPU backend would run on the host, as report entries."""
    from .backend.cpu.hostops import host_op_entry
    from .backend.cpu.runtime import host_steps

    return [host_op_entry(s) for s in host_steps(model)]


def refuse_host_ops(hosts: Sequence[Mapping[str, Any]], config: FusionConfig) -> None:
    """Raise `host_op_refused`, listing each op and its reason, when the config forbids fallbacks."""
    if config.allow_host_ops or not hosts:
        return
    listed = "; ".join(f"{h['op_type']} {h['node']!r} [{h['code']}]: {h['reason']}" for h in hosts)
    raise UnsupportedModelError(
        f"{len(hosts)} op(s) cannot be compiled and would run on the host, which "
        f"config.allow_host_ops=False forbids: {listed}",
        code="host_op_refused",
        host_ops=[dict(h) for h in hosts],
    )


def _as_config(config: FusionConfig | Mapping[str, Any] | None) -> FusionConfig:
    if config is None:
        return FusionConfig()
    if isinstance(config, FusionConfig):
        return config.model_copy(deep=True)
    try:
        return FusionConfig.model_validate(dict(config))
    except Exception as err:  # pydantic.ValidationError: report it as the engine's config error
        raise InvalidConfigError(f"invalid fusion config: {err}", code="invalid_config") from None


def fuse(
    model: ModelSource,
    config: FusionConfig | Mapping[str, Any] | None = None,
    *,
    patterns: Sequence[Pattern | PatternSpec | Mapping[str, Any]] = (),
    progress: Progress | None = None,
) -> FusedGraph:
    """Load, canonicalize, plan and export `model` (a path, bytes or ModelProto)."""
    fuser = Fuser(config)
    for p in patterns:
        fuser.register_pattern(p)
    return fuser.fuse(model, progress=progress)


__all__ = ["FusedGraph", "Fuser", "fuse"]
