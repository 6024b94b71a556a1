"""Compile a fused model into Triton kernels for `cuda` or `ascend910` and run it (docs/targets.md).

    compiled = compile_triton(fused_model, target="cuda")
    outputs = compiled({"input": x})                  # numpy in, numpy out
    compiled.stats["host_ops"], compiled.artifacts()

The execution plan is the CPU runtime's (backend/cpu/extract.py): views alias, kernels launch,
host ops run through the CPU backend's host-op path; the walk around the kernels (host-op
fallbacks, the stats every report has, input checks) is backend/steps.py's, shared with it. Each
kernel is lowered to the kernel IR (or rendered from its anchor match, anchor.py) as a Triton
module, written under the cache by the digest of its text and imported from there (Triton reads
a jit function's source from its file), so identical kernels are rendered and compiled once. A
kernel the renderer declines runs as a host op with code `codegen_unsupported` and the
renderer's sentence — listed, never silent.

Where it runs: with `TRITON_INTERPRET=1` in the Triton CPU interpreter on CPU torch tensors;
otherwise on the target's device (`cuda`; `npu` through torch_npu for `ascend910`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import onnx

from ...errors import UnsupportedModelError
from ...hardware import HardwareProfile, get_profile
from ...kernel_ir import DType
from ...lower.values import Unsupported
from ..cpu.extract import ExecutionPlan, HostStep, KernelStep, ViewStep, extract
from ..cpu.hostops import HostOp
from ..cpu.kernel_spec import KernelSpec
from ..steps import (
    PlannedModel,
    check_inputs,
    host_shape_error,
    plan_stats,
    refuse_object_tensors,
    resolve_steps,
)
from .ahead import compile_ahead
from .blocks import LaunchConfig, check_ascend, configure, is_ascend
from .chains import ROW_STAGES, expand_steps, split_chain, split_row_stages
from .kernels import render_spec
from .render import Launch, RenderedKernel
from .tune import autotune, load_tuned

TARGETS = ("cuda", "ascend910")
_DEVICES = {"cuda": "cuda", "ascend910": "npu"}


def interpreting() -> bool:
    """Whether kernels run in Triton's CPU interpreter (`TRITON_INTERPRET=1`)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def target_profile(target: str) -> HardwareProfile:
    if target not in TARGETS:
        raise UnsupportedModelError(
            f"unknown accelerator target {target!r}; known: cpu, {', '.join(TARGETS)}", code="unknown_target"
        )
    return get_profile(target)


def _torch() -> Any:
    try:
        import torch
        import triton  # noqa: F401 - the target needs both
    except ImportError as exc:
        raise UnsupportedModelError(
            f"the Triton targets need torch and triton installed: {exc}", code="target_unavailable"
        ) from exc
    return torch


def _device(target: str) -> str:
    """Where tensors live: the CPU under the interpreter, else the target's device (checked)."""
    if interpreting():
        return "cpu"
    torch = _torch()
    if target == "cuda":
        if not torch.cuda.is_available():
            raise UnsupportedModelError(
                "target cuda needs an NVIDIA GPU (torch.cuda.is_available() is False); set "
                "TRITON_INTERPRET=1 to run the kernels in Triton's CPU interpreter",
                code="target_unavailable",
            )
        return "cuda"
    try:
        import torch_npu  # noqa: F401  (registers the npu device)
    except ImportError as exc:
        raise UnsupportedModelError(
            "target ascend910 needs torch_npu and triton-ascend on a host with CANN; set "
            "TRITON_INTERPRET=1 to run the kernels in Triton's CPU interpreter",
            code="target_unavailable",
        ) from exc
    return "npu"


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    if cache_dir is not None:
        return Path(cache_dir) / "triton"
    root = os.environ.get("AUTOFUSION_CACHE_DIR") or os.path.join(Path.home(), ".cache", "graph_autofusion")
    return Path(root) / "triton"


_MODULES: dict[str, ModuleType] = {}
_MODULES_LOCK = threading.Lock()


def load_module(source: str, root: Path) -> tuple[str, ModuleType, Path]:
    """Write `source` under `root` by its digest (once) and import it (once per process)."""
    digest = hashlib.sha256(source.encode()).hexdigest()
    path = root / f"{digest}.py"
    key = f"{digest}:{int(interpreting())}"  # @triton.jit decides at import whether it interprets
    with _MODULES_LOCK:
        found = _MODULES.get(key)
        if found is not None:
            return digest, found, path
        root.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text(encoding="utf-8") != source:
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(source, encoding="utf-8")
            os.replace(tmp, path)
        name = f"af_triton_{digest[:24]}_{int(interpreting())}"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        _MODULES[key] = module
        return digest, module, path


@dataclass
class TritonKernel:
    """A rendered, imported kernel and the launch configuration of each of its functions."""

    symbol: str
    template: str
    rendered: RenderedKernel
    digest: str
    path: Path
    module: ModuleType
    configs: list[LaunchConfig]
    binaries: list[dict[str, Any]] | None = None  # compiled ahead of time, on first request
    tuned: bool = False  # block sizes searched on the device (tune.py)


def _element_type_reason(spec: KernelSpec) -> str:
    for info in spec.tensors.values():
        try:
            DType.from_onnx(info.elem_type)
        except ValueError as exc:
            return str(exc)
    return ""


def build_kernel(spec: KernelSpec, profile: HardwareProfile, root: Path) -> TritonKernel:
    """Render, configure (held to the target's constraints) and import one kernel."""
    why = _element_type_reason(spec)
    if why:
        raise Unsupported(why)
    rendered = render_spec(spec, profile)
    configs = [configure(launch, profile) for launch in rendered.launches]
    if is_ascend(profile):
        for launch, config in zip(rendered.launches, configs, strict=True):
            problems = check_ascend(config, profile)
            if problems:
                raise Unsupported(f"{launch.function}: {'; '.join(problems)}")
    digest, module, path = load_module(rendered.source, root)
    return TritonKernel(spec.symbol, spec.template, rendered, digest, path, module, configs)


def compile_triton(
    model: onnx.ModelProto, *, target: str, cache_dir: str | os.PathLike[str] | None = None
) -> TritonCompiledModel:
    """Render and load every kernel of `model` for `target` (see the module docstring)."""
    started = time.perf_counter()
    profile = target_profile(target)
    device = _device(target)
    plan = extract(model)
    refuse_object_tensors(plan)
    kernels, declined = build_kernels(plan, profile, cache_root(cache_dir))
    compiled = TritonCompiledModel(plan, kernels, declined, target=target, profile=profile, device=device)
    compiled.stats["compile_seconds"] = round(time.perf_counter() - started, 4)
    return compiled


def build_kernels(
    plan: ExecutionPlan, profile: HardwareProfile, root: Path
) -> tuple[dict[str, TritonKernel], dict[str, str]]:
    """Every kernel of `plan` for `profile`, and why each one that is not rendered is not. Anchor
    chains are split into one kernel per contraction, row stages planned for the CPU into kernels of
    their own (chains.py); `plan.steps` then call the parts."""
    kernels: dict[str, TritonKernel] = {}
    declined: dict[str, str] = {}
    parts: dict[str, list[KernelSpec]] = {}
    for symbol, spec in list(plan.specs.items()):
        try:
            kernels[symbol] = build_kernel(spec, profile, root)
        except Unsupported as exc:
            declined[symbol] = str(exc)
            staged = any(n.op_type in ROW_STAGES for n in spec.nodes)
            if spec.template == "anchor_chain" or (spec.template == "anchor" and staged):
                _build_chain(spec, profile, root, kernels, parts, declined)
    expand_steps(plan, parts)
    return kernels, declined


def _build_chain(
    spec: KernelSpec,
    profile: HardwareProfile,
    root: Path,
    kernels: dict[str, TritonKernel],
    parts: dict[str, list[KernelSpec]],
    declined: dict[str, str],
) -> None:
    """An anchor chain as one kernel per contraction, a row stage planned for the CPU (a closing
    LayerNormalization, an opening GlobalAveragePool) as a kernel of its own (chains.py), when
    every part renders."""
    try:
        staged = any(n.op_type in ROW_STAGES for n in spec.nodes)
        split = split_row_stages(spec) if staged else split_chain(spec)
        built = {part.symbol: build_kernel(part, profile, root) for part in split}
    except Unsupported as exc:
        declined[spec.symbol] = f"{declined[spec.symbol]}; split per contraction: {exc}"
        return
    kernels.update(built)
    parts[spec.symbol] = split
    del declined[spec.symbol]


class TritonCompiledModel(PlannedModel):
    """A model whose kernels are Triton functions: call it with numpy inputs (docs/targets.md)."""

    def __init__(
        self,
        plan: ExecutionPlan,
        kernels: Mapping[str, TritonKernel],
        declined: Mapping[str, str],
        *,
        target: str,
        profile: HardwareProfile,
        device: str,
    ) -> None:
        self.plan = plan
        self.model = plan.model
        self.target = target
        self.profile = profile
        self.device = device
        self.mode = "interpret" if device == "cpu" else "device"
        self.kernels = dict(kernels)
        self.declined = dict(declined)
        self._torch = _torch()
        self._lock = threading.Lock()
        self._steps = resolve_steps(plan, self.kernels, self.declined)
        self._weights = {n: self._to_device(v) for n, v in plan.initializers.items()}
        self._tables: dict[str, list[Any]] = {
            s: [self._to_device(np.asarray(v)) for _, v in k.rendered.constants]
            for s, k in self.kernels.items()
        }
        self._hosts: dict[int, HostOp] = {
            k: HostOp(s.node, plan.tensors, plan.model)
            for k, s in enumerate(self._steps)
            if isinstance(s, HostStep)
        }
        self.stats: dict[str, Any] = self._stats()

    # -- conversions ---------------------------------------------------------------------------
    def _to_device(self, array: np.ndarray) -> Any:
        torch = self._torch
        array = np.ascontiguousarray(array)
        if array.dtype.name == "bfloat16":
            return torch.from_numpy(array.view(np.int16).copy()).view(torch.bfloat16).to(self.device)
        return torch.from_numpy(array.copy()).to(self.device)

    def _to_numpy(self, tensor: Any, dtype: np.dtype) -> np.ndarray:
        torch = self._torch
        t = tensor.detach().contiguous().cpu()
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().view(dtype)
        return t.numpy()

    def _empty(self, name: str) -> Any:
        info = self.plan.tensors[name]
        torch = self._torch
        dtype = _TORCH_DTYPES[info.elem_type](torch)
        return torch.empty(info.shape, dtype=dtype, device=self.device)

    # -- running ------------------------------------------------------------------------------
    def run(self, inputs: Mapping[str, Any] | Sequence[Any] | np.ndarray) -> dict[str, np.ndarray]:
        """Run the model: inputs by name (dict) or position; outputs by name, in model order."""
        feeds = check_inputs(self.plan.inputs, inputs)
        with self._lock:
            values: dict[str, Any] = dict(self._weights)
            for name, value in feeds.items():
                values[name] = self._to_device(value)
            for k, step in enumerate(self._steps):
                if isinstance(step, ViewStep):
                    info = self.plan.tensors[step.output]
                    values[step.output] = values[step.input].reshape(info.shape)
                elif isinstance(step, HostStep):
                    self._run_host(self._hosts[k], values)
                else:
                    self._launch(step, values)
            return {
                t.name: self._to_numpy(values[t.name], t.dtype).reshape(t.shape) for t in self.plan.outputs
            }

    def _run_host(self, op: HostOp, values: dict[str, Any]) -> None:
        arrays = [self._to_numpy(values[n], self.plan.tensors[n].dtype) for n in op.input_names]
        for name, result in zip(op.output_names, op(arrays), strict=True):
            info = self.plan.tensors[name]
            if tuple(result.shape) != tuple(info.shape):
                raise host_shape_error(op, result.shape, info.shape)
            values[name] = self._to_device(np.asarray(result, dtype=info.dtype))

    def _launch(self, step: KernelStep, values: dict[str, Any]) -> None:
        kernel = self.kernels[step.symbol]
        torch = self._torch
        args = []
        for name in step.inputs:
            args.append(values[name].contiguous() if name else torch.zeros(1, device=self.device))
        for name in step.outputs:
            values[name] = self._empty(name)
            args.append(values[name])
        args.extend(self._tables[step.symbol])
        for buf, copies in kernel.rendered.scratch:
            dtype = _TORCH_DTYPES[buf.dtype.onnx](torch)
            args.append(torch.empty(max(buf.size * copies, 1), dtype=dtype, device=self.device))

        def run(launch: Launch, config: LaunchConfig) -> None:
            fn = getattr(kernel.module, launch.function)
            fn[(config.grid,)](*args, config.nblocks, config.grid, **config.meta, **config.options)

        if self.mode == "device" and not kernel.tuned:
            self._tune(kernel, run)
        for launch, config in zip(kernel.rendered.launches, kernel.configs, strict=True):
            run(launch, config)

    def _tune(self, kernel: TritonKernel, run: Callable[[Launch, LaunchConfig], None]) -> None:
        """Stored winners for this profile, else a search on the device (tune.py)."""
        launches = kernel.rendered.launches
        found = load_tuned(kernel.path, self.profile, launches)
        if found is None:
            sync = getattr(self._torch, self.device).synchronize
            found = autotune(launches, kernel.configs, self.profile, run, sync, kernel.path)
        kernel.configs = found
        kernel.binaries = None  # block sizes changed: binaries are made again on request
        kernel.tuned = True

    # -- reports ------------------------------------------------------------------------------
    def _stats(self) -> dict[str, Any]:
        def extra(step: KernelStep) -> dict[str, Any]:
            k = self.kernels[step.symbol]
            return {"digest": k.digest, "launches": len(k.configs)}

        common = plan_stats(self.plan, self._steps, lambda s: self.kernels[s].template, extra)
        return {"target": self.target, "mode": self.mode, "profile": self.profile.name, **common}

    def artifacts(self) -> list[dict[str, Any]]:
        """One record per unique kernel: its source, launches and (on a device) binaries."""
        out = []
        for symbol, k in self.kernels.items():
            out.append(
                {
                    "symbol": symbol,
                    "digest": k.digest,
                    "template": k.template,
                    "source": k.rendered.source,
                    "path": str(k.path),
                    "launches": [
                        {
                            "function": launch.function,
                            "grid": [config.grid],
                            "blocks": config.nblocks,
                            "meta": {**config.meta, **config.options},
                            "working_set_bytes": config.working_set,
                        }
                        for launch, config in zip(k.rendered.launches, k.configs, strict=True)
                    ],
                    "binaries": self._binaries(k),
                }
            )
        return out

    def _binaries(self, kernel: TritonKernel) -> list[dict[str, Any]]:
        """The compiled binary of each launch with its metadata: for CUDA compiled ahead of time
        for the profile's compute capability (no device needed, ahead.py); none while the
        process interprets (Triton's library is then bound to the interpreter) or on Ascend,
        whose compiler only exists on CANN hosts."""
        if self.target != "cuda" or interpreting():
            return []
        if kernel.binaries is None:
            kernel.binaries = compile_ahead(kernel.rendered, kernel.module, kernel.configs, self.profile)
        return kernel.binaries

    def save_artifacts(self, directory: str | os.PathLike[str]) -> Path:
        """manifest.json and kernels/<digest>.py (+ binaries on a device) under `directory`."""
        root = Path(directory)
        (root / "kernels").mkdir(parents=True, exist_ok=True)
        records = []
        for record in self.artifacts():
            (root / "kernels" / f"{record['digest']}.py").write_text(record.pop("source"), encoding="utf-8")
            record.pop("path")
            binaries = []
            for j, b in enumerate(record.pop("binaries")):
                data = b.pop("binary")
                if isinstance(data, bytes | str) and b["kind"]:
                    name = f"{record['digest']}.{j}.{b['kind']}"
                    mode = "wb" if isinstance(data, bytes) else "w"
                    with open(root / "kernels" / name, mode) as f:
                        f.write(data)
                    b["path"] = f"kernels/{name}"
                binaries.append(b)
            record["binaries"] = binaries
            record["source"] = f"kernels/{record['digest']}.py"
            records.append(record)
        manifest = {
            "target": self.target,
            "mode": self.mode,
            "profile": self.profile.model_dump(),
            "host_ops": self.stats["host_ops"],
            "kernels": records,
        }
        (root / "manifest.json").write_text(json.dumps(manifest, indent=2, default=str), encoding="utf-8")
        return root


_TORCH_DTYPES = {
    onnx.TensorProto.FLOAT: lambda t: t.float32,
    onnx.TensorProto.DOUBLE: lambda t: t.float64,
    onnx.TensorProto.FLOAT16: lambda t: t.float16,
    onnx.TensorProto.BFLOAT16: lambda t: t.bfloat16,
    onnx.TensorProto.INT64: lambda t: t.int64,
    onnx.TensorProto.INT32: lambda t: t.int32,
    onnx.TensorProto.INT16: lambda t: t.int16,
    onnx.TensorProto.INT8: lambda t: t.int8,
    onnx.TensorProto.UINT8: lambda t: t.uint8,
    onnx.TensorProto.UINT16: lambda t: t.uint16,
    onnx.TensorProto.UINT32: lambda t: t.uint32,
    onnx.TensorProto.UINT64: lambda t: t.uint64,
    onnx.TensorProto.BOOL: lambda t: t.bool,
}
