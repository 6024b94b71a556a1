"""Compile a fused (or canonical) ONNX model into native kernels and run it.

    compiled = compile_model(fused_model, threads=2)
    outputs = compiled({"input": x})          # or compiled(x) / compiled.run([x, y])
    compiled.stats["arena_bytes"], compiled.stats["host_ops"]
    compiled.save_bundle("model.bundle.tar.gz")   # graph_autofusion.load(...) elsewhere

How a run works: everything is decided at load time. Every intermediate tensor has a fixed offset
in one arena (arena.py), views alias their source, weights sit in their own arrays, and each
kernel's `void *args[]` array of pointers is built once. A run copies the inputs into the arena,
makes one ctypes call per run of consecutive kernels into a tiny C driver that calls them in
order (a Python-level ctypes call per kernel costs ~1 us; the driver costs a few ns per kernel),
runs any host ops in between, and copies the outputs out. The walk around the kernels (host-op
fallbacks, the stats every runtime reports, input checks) is backend/steps.py's, shared with
the Triton targets.

Packed weights: a kernel that takes a constant weight in the contraction library's panel layout
gets it packed once (by its own `<symbol>_prepack`, or read back from a bundle that stored it,
bundle.py). A weight that every kernel reads only in packed form (`<symbol>_prepack_only`,
render_c.py) is then released: the runtime never holds it twice, and those kernels get NULL in
its place (they do not even declare it). Weights that a host op, another kernel or an output
reads stay raw.

Threads: the generated kernels own the parallelism (OpenMP, `threads` wide); BLAS inside a kernel
runs single-threaded (blas.load_blas sets it) so the two pools never oversubscribe the cores.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from ...errors import InvalidModelError, IsaMismatchError
from ..steps import (
    PlannedModel,
    check_inputs,
    host_shape_error,
    plan_stats,
    refuse_object_tensors,
    resolve_steps,
    with_host_fallbacks,
)
from . import sanitize, threadpool
from .arena import ALIGNMENT, Buffer, plan_offsets
from .cache import KernelCache, default_cache
from .codegen import CodegenUnsupported, GeneratedKernel, generate
from .compiler import Artifact, KernelSource, compile_kernels
from .contraction import contraction_mode
from .extract import ExecutionPlan, HostStep, KernelStep, Step, ViewStep, extract
from .hostops import HostOp
from .isa import ISA_ENV, IsaTarget, host_isa, target_isa
from .kernel_spec import KernelSpec
from .render_c import PARALLEL_MIN_MACS_SYMBOL, PREPACK_ONLY_SUFFIX, WORKSPACE_SUFFIX
from .team import TeamChoice
from .threads import available_cpus, parallel_min_macs, set_omp_threads

DRIVER_SYMBOL = "af_run_sequence"
PREPACK_SUFFIX = "_prepack_floats"  # kernel_spec.py: weights packed once at load
PackedKey = tuple[str, tuple[str, ...]]  # (kernel symbol, its operand names at the call site)
DRIVER_SOURCE = """\
/* Calls a sequence of generated kernels from one foreign-function call:
 * fns[i](args[i]) for i in [0, n). */
#include <stdint.h>
typedef void (*af_kernel_fn)(void *const *);
void af_run_sequence(int64_t n, const af_kernel_fn *fns, void *const *const *args) {
  for (int64_t i = 0; i < n; ++i) fns[i](args[i]);
}
"""
_KERNEL_FN = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p))


@dataclass(frozen=True)
class KernelInfo:
    """A compiled kernel as the runtime and the bundle see it."""

    symbol: str
    template: str
    method: str
    uses_blas: bool
    digest: str
    path: Path
    cached: bool = False


def compile_model(
    model: onnx.ModelProto,
    *,
    cache: KernelCache | None = None,
    threads: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    jobs: int | None = None,
    isa: IsaTarget | None = None,
) -> CompiledModel:
    """Generate, compile (through the kernel cache) and load every kernel of `model`.

    `isa` defaults to `isa.target_isa()`; kernels built for an ISA this host lacks load (to be
    saved as a bundle for a stronger host) but refuse to run (`isa_mismatch`).
    """
    started = time.perf_counter()
    isa = isa or target_isa()
    sanitize.require_runtime(sanitize.sanitize_mode())
    cache = cache if cache is not None else default_cache()
    plan = extract(model)
    sources: list[KernelSource] = []
    meta: dict[str, tuple[str, str, bool]] = {}
    unsupported: dict[str, str] = {}
    refuse_object_tensors(plan)
    for symbol, spec in plan.specs.items():
        why = _no_c_type(spec)
        if why:
            unsupported[symbol] = why
            continue
        try:
            kernel = generate_once(spec)
        except CodegenUnsupported as exc:
            unsupported[symbol] = str(exc)
            continue
        sources.append(KernelSource(symbol, kernel.source, uses_blas=kernel.uses_blas))
        meta[symbol] = (spec.template, kernel.method, kernel.uses_blas)
    sources += support_sources()
    artifacts = compile_kernels(sources, cache=cache, jobs=jobs, progress=progress, combine=True, isa=isa)
    kernels: dict[str, KernelInfo] = {}
    support: dict[str, Artifact] = {}
    for art in artifacts:
        if art.name in (DRIVER_SYMBOL, threadpool.SYMBOL):
            support[art.name] = art
            continue
        template, method, uses_blas = meta[art.name]
        kernels[art.name] = KernelInfo(
            art.name, template, method, uses_blas, art.digest, art.path, art.cached
        )
    driver = support[DRIVER_SYMBOL]
    compiled = CompiledModel(
        plan,
        kernels,
        unsupported,
        driver_path=driver.path,
        driver_digest=driver.digest,
        pool_path=support[threadpool.SYMBOL].path,
        pool_digest=support[threadpool.SYMBOL].digest,
        threads=threads,
        isa=isa,
    )
    hits = sum(1 for a in artifacts if a.cached)
    compiled.stats["compile_seconds"] = round(time.perf_counter() - started, 4)
    compiled.stats["cache"] = {"hits": hits, "misses": len(artifacts) - hits}
    return compiled


def support_sources() -> list[KernelSource]:
    """What every compiled model links with besides its kernels: the driver that calls them in
    sequence, and the thread pool their parallel loops run on (threadpool/__init__.py)."""
    return [KernelSource(DRIVER_SYMBOL, DRIVER_SOURCE, uses_openmp=False), threadpool.source()]


def _no_c_type(spec: KernelSpec) -> str:
    """Why `spec` cannot be generated for its element types ("" when it can): a tensor whose
    type has no C type in the generators (fp8, int4, complex, ...) makes the kernel run on the
    host (onnx.reference), right and slow, instead of failing the whole model."""
    for info in spec.tensors.values():
        try:
            info.ctype  # noqa: B018 - raises for an element type the generators do not know
        except ValueError as exc:
            return str(exc)
    return ""


_GENERATED: dict[tuple[str, str], GeneratedKernel | CodegenUnsupported] = {}
_GENERATED_MAX = 4096


def generate_once(spec: KernelSpec) -> GeneratedKernel:
    """`generate`, remembered by symbol (extract names a kernel by the digest of its canonical
    spec): fusion asks once to list host ops, compiling asks again, repeated blocks share one.
    The contraction mode is part of the key: it changes the source of anchors."""
    key = (spec.symbol, contraction_mode())
    found = _GENERATED.get(key)
    if found is None:
        try:
            found = generate(spec)
        except CodegenUnsupported as exc:
            found = exc
        if len(_GENERATED) >= _GENERATED_MAX:
            _GENERATED.clear()
        _GENERATED[key] = found
    if isinstance(found, CodegenUnsupported):
        raise CodegenUnsupported(str(found))
    return found


def host_steps(model: onnx.ModelProto) -> list[HostStep]:
    """The ops of `model` that would run on the host, with their reason codes, without compiling.

    Generating C source is cheap (tens of ms for ResNet-50) next to compiling it, so fusion asks
    the generators up front and the report can list every fallback before any compiler runs.
    """
    plan = extract(model)
    declined: dict[str, str] = {}
    for symbol, spec in plan.specs.items():
        why = _no_c_type(spec)
        if why:
            declined[symbol] = why
            continue
        try:
            generate_once(spec)
        except CodegenUnsupported as exc:
            declined[symbol] = str(exc)
    return [s for s in with_host_fallbacks(plan.steps, declined) if isinstance(s, HostStep)]


class CompiledModel(PlannedModel):
    """A model whose kernels are loaded and whose memory is planned: call it with inputs."""

    def __init__(
        self,
        plan: ExecutionPlan,
        kernels: Mapping[str, KernelInfo],
        unsupported: Mapping[str, str],
        *,
        driver_path: Path,
        driver_digest: str,
        pool_path: Path | None = None,
        pool_digest: str | None = None,
        threads: int | None = None,
        isa: IsaTarget | None = None,
        packed: Mapping[PackedKey, np.ndarray] | None = None,
        released: Collection[str] = (),
        model_file: Path | None = None,
    ) -> None:
        """`packed`: weights already packed by these very kernels (a bundle's, read back), used
        instead of packing at load; each must be the size its kernel asks for. `released`:
        weights left out of `plan.initializers` because only those packed buffers read them (a
        bundle lists them), so they are never held raw, not even while loading. `model_file`: the
        model is not held (`plan.model` is its graph without weights, onnx_utils.light_model);
        `model` reads it back from there."""
        started = time.perf_counter()
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.plan = plan
        self._model: onnx.ModelProto | None = None if model_file else plan.model
        self.model_file = model_file  # where `model` is read from when it is not held
        self.kernels = dict(kernels)
        self.unsupported = dict(unsupported)
        self.threads = threads or available_cpus()
        # each run's team: the full one, or one thread while that is measurably faster (team.py)
        self.team = TeamChoice(self.threads)
        self.driver_path = driver_path
        self.driver_digest = driver_digest
        # the thread pool the kernels' parallel loops run on; None (a bundle saved before the
        # pool): libgomp's teams. Decided once: every unit this model loads is attached alike.
        self.pool_path = pool_path
        self.pool_digest = pool_digest
        self.thread_pool = "pool" if pool_path is not None and threadpool.enabled() else "openmp"
        # What the kernels were built for. Mapping them runs none of their code (they have no
        # constructors), so a foreign ISA loads; calling them is refused in `_require_isa`.
        self.isa = isa or target_isa()
        self._lock = threading.Lock()
        self._libs: dict[Path, ctypes.CDLL] = {}
        # Debug mode (sanitize.py): redzones, one kernel at a time, live-range poisoning.
        self.sanitize = sanitize.sanitize_mode()
        self._runs = 0
        self._stored_packed = dict(packed or {})
        self._released: dict[str, int] = {}  # weights held in packed form only -> raw bytes
        for name in released:
            info = plan.tensors[name]
            self._released[name] = info.numel * info.dtype.itemsize
        if any(k.uses_blas for k in self.kernels.values()):
            from .blas import load_blas

            load_blas()
        self._driver = self._lib(driver_path)[DRIVER_SYMBOL]
        self._driver.argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]
        self._driver.restype = None
        self._steps = self._resolve_steps()
        self._plan_memory()
        self._build_program()
        self._bind_io()
        self._set_parallel_bar()
        self.dispatch = "driver"
        self.stats: dict[str, Any] = self._stats()
        self.stats["load_seconds"] = round(time.perf_counter() - started, 4)

    # -- loading -------------------------------------------------------------------------------
    def _lib(self, path: Path) -> ctypes.CDLL:
        if path not in self._libs:
            lib = ctypes.CDLL(str(path))
            if self.thread_pool == "pool":
                threadpool.attach(lib, self.pool_path)
            self._libs[path] = lib
        return self._libs[path]

    def _resolve_steps(self) -> list[Step]:
        return resolve_steps(self.plan, self.kernels, self.unsupported)

    def _plan_memory(self) -> None:
        plan = self.plan
        self._root: dict[str, str] = {}
        for step in self._steps:
            if isinstance(step, ViewStep):
                self._root[step.output] = self._root.get(step.input, step.input)
        root = lambda n: self._root.get(n, n)  # noqa: E731
        self._weights = {n: np.ascontiguousarray(v) for n, v in plan.initializers.items()}
        first: dict[str, int] = {t.name: -1 for t in plan.inputs}
        last: dict[str, int] = {t.name: -1 for t in plan.inputs}
        for k, step in enumerate(self._steps):
            if isinstance(step, ViewStep):
                continue
            for name in step.inputs:
                if name:
                    r = root(name)
                    last[r] = max(last.get(r, k), k)
            for name in step.outputs:
                if name:
                    first.setdefault(name, k)
                    last[name] = max(last.get(name, k), k)
        end = len(self._steps)
        for t in plan.outputs:
            last[root(t.name)] = end
        buffers = []
        redzone = sanitize.REDZONE_BYTES if self.sanitize else 0
        self._extents: dict[str, tuple[int, int, int]] = {}  # name -> (bytes, first, last)
        for name, start in first.items():
            if name in self._weights:
                continue
            info = plan.tensors[name]
            nbytes = info.numel * info.dtype.itemsize
            self._extents[name] = (nbytes, start, last.get(name, start))
            buffers.append(Buffer(name, nbytes + redzone, start, last.get(name, start)))
        offsets, peak = plan_offsets(buffers)
        # Kernels run one at a time, so one workspace (a slice per thread) serves them all; it
        # sits after the tensors, in the same allocation.
        self.workspace_slice = max(self._workspace_slices().values(), default=0)
        self.workspace_bytes = self.workspace_slice * self.threads
        self._workspace_offset = peak
        self.arena_bytes = peak + self.workspace_bytes
        try:
            raw = np.zeros(self.arena_bytes + ALIGNMENT, dtype=np.uint8)
        except MemoryError:
            raise MemoryError(
                f"cannot allocate the runtime arena: {self.arena_bytes} bytes ({peak} for tensors, "
                f"{self.workspace_bytes} of kernel workspace for {self.threads} threads)"
            ) from None
        shift = (-raw.ctypes.data) % ALIGNMENT
        self._arena = raw[shift : shift + self.arena_bytes]
        self._offsets = offsets
        self._scratch: dict[str, np.ndarray] = {}
        # Weights packed once for the contraction library, per (kernel, its operands).
        self._packed: dict[PackedKey, np.ndarray] = {}

    def _workspace_slices(self) -> dict[str, int]:
        """Bytes of one thread's workspace slice per kernel that takes one (render_c.py)."""
        found = {}
        for step in self._steps:
            if isinstance(step, KernelStep) and step.symbol not in found:
                lib = self._lib(self.kernels[step.symbol].path)
                try:
                    found[step.symbol] = int(ctypes.c_int64.in_dll(lib, step.symbol + WORKSPACE_SUFFIX).value)
                except ValueError:  # no such symbol: the kernel takes no workspace
                    found[step.symbol] = 0
        return found

    def _prepack_only(self, symbol: str) -> int:
        """Bit j set: the kernel's parameter j is read only by its prepack (render_c.py)."""
        lib = self._lib(self.kernels[symbol].path)
        try:
            return int(ctypes.c_int64.in_dll(lib, symbol + PREPACK_ONLY_SUFFIX).value)
        except ValueError:  # no such symbol: the body reads every parameter it is given
            return 0

    def _packed_only_weights(self) -> set[str]:
        """Weights that nothing reads raw once packed: every use is a parameter that its kernel
        reads through the packed form only. A host op, an output, a kernel that reads it raw (a
        BLAS operand, an epilogue bias) or a kernel that packs nothing keeps it raw."""
        masks = {s.symbol: self._prepack_only(s.symbol) for s in self._steps if isinstance(s, KernelStep)}
        packed_uses: set[str] = set()
        raw_uses = {self._root.get(t.name, t.name) for t in self.plan.outputs}
        for step in self._steps:
            if isinstance(step, ViewStep):
                continue
            for j, name in enumerate(step.inputs):
                r = self._root.get(name, name)
                if not name or (r not in self._weights and r not in self._released):
                    continue
                if isinstance(step, KernelStep) and masks[step.symbol] >> j & 1:
                    packed_uses.add(r)
                else:
                    raw_uses.add(r)
        wrong = sorted(raw_uses & set(self._released))
        if wrong:
            raise InvalidModelError(
                f"weight {wrong[0]!r} was left out as read only packed, but is read raw here",
                code="bundle_corrupt",
                weight=wrong[0],
            )
        return packed_uses - raw_uses - set(self._released)

    def array(self, name: str) -> np.ndarray:
        """The live storage of a tensor (a view into the arena or a weight array)."""
        info = self.plan.tensors[name]
        r = self._root.get(name, name)
        if r in self._weights:
            return self._weights[r].reshape(info.shape)
        if r in self._released:
            raise KeyError(f"weight {name!r} is held only packed for the kernels that read it")
        offset = self._offsets[r]
        nbytes = info.numel * info.dtype.itemsize
        return self._arena[offset : offset + nbytes].view(info.dtype).reshape(info.shape)

    def _pointer(self, name: str, spec_info_nbytes: int) -> int:
        if not name:
            buf = np.zeros(max(spec_info_nbytes, 1), dtype=np.uint8)
            self._scratch[f"_{len(self._scratch)}"] = buf
            return int(buf.ctypes.data)
        return int(self.array(name).ctypes.data)

    def _build_program(self) -> None:
        """Turn steps into segments: runs of kernels (one driver call) and host ops."""
        self._segments: list[tuple[str, Any]] = []
        self._argvs: list[Any] = []
        self._fns: dict[str, Any] = {}
        run_fns: list[int] = []
        run_args: list[int] = []
        self._per_kernel: list[tuple[Any, Any]] = []

        def flush() -> None:
            if run_fns:
                fns = (ctypes.c_void_p * len(run_fns))(*run_fns)
                args = (ctypes.c_void_p * len(run_args))(*run_args)
                self._segments.append(("kernels", (len(run_fns), fns, args)))
                self._argvs.extend([fns, args])
                run_fns.clear()
                run_args.clear()

        workspace = self._workspace_slices()
        # Packing runs kernel code: for kernels this host cannot run (built to be saved as a
        # bundle for another host) nothing is packed or released; that host packs at load.
        self._packs = self.isa.runs_on(host_isa())
        packed_only = self._packed_only_weights() if self._packs else set()
        for step in self._steps:
            if isinstance(step, ViewStep):
                continue
            if isinstance(step, HostStep):
                flush()
                op = HostOp(step.node, self.plan.tensors, self.plan.model)
                ins = [self.array(n) for n in op.input_names]
                outs = [self.array(n) for n in op.output_names]
                self._segments.append(("host", (op, ins, outs)))
                continue
            info = self.kernels[step.symbol]
            spec = self.plan.specs[step.symbol]
            if step.symbol not in self._fns:
                fn = self._lib(info.path)[step.symbol]
                fn.argtypes = [ctypes.c_void_p]
                fn.restype = None
                self._fns[step.symbol] = fn
            fn = self._fns[step.symbol]
            params = [*spec.inputs, *spec.outputs]
            names = [*step.inputs, *step.outputs]
            # NULL for what the body reads only packed: it does not even declare those parameters.
            mask = self._prepack_only(step.symbol)
            ptrs = [
                0 if mask >> j & 1 else self._pointer(n, p.numel * p.dtype.itemsize)
                for j, (n, p) in enumerate(zip(names, params, strict=True))
            ]
            packed = self._prepack(step, self._lib(info.path), self._with_weights(ptrs, names, mask))
            if packed is not None:
                ptrs.append(packed)
            if workspace.get(step.symbol):
                ptrs += [int(self._arena.ctypes.data) + self._workspace_offset, self.threads]
            argv = (ctypes.c_void_p * max(len(ptrs), 1))(*ptrs)
            self._argvs.append(argv)
            run_fns.append(ctypes.cast(fn, ctypes.c_void_p).value or 0)
            run_args.append(ctypes.addressof(argv))
            self._per_kernel.append((fn, argv))
        flush()
        self._release(packed_only)

    def _bind_io(self) -> None:
        """The storage of every input and output, as views made once: a run of a small model
        is short enough that slicing the arena again per call showed (`array` costs ~1 us a
        tensor, half the Python-side time of a batch-1 MLP's run). The arena and the weights
        never move, so the views stay valid for the model's life."""
        self._input_views = [(t.name, t.dtype, tuple(t.shape), self.array(t.name)) for t in self.plan.inputs]
        self._output_views = [(t.name, self.array(t.name)) for t in self.plan.outputs]
        self._isa_missing: list[str] | None = None  # what this host lacks, found at the first run

    def _set_parallel_bar(self) -> None:
        """Give every loaded kernel unit the bar its contraction loops compare their work with
        before waking the thread team (`threads.parallel_min_macs`: from the wait policy in
        effect, the team size and the kernels' ISA). Units shared by models (a kernel cache path
        is loaded once per process) share the bar: the last model loaded sets it. Units built
        before the bar existed have none and always take the team."""
        self.parallel_min_macs = parallel_min_macs(self.threads, isa_level=self.isa.level)
        for lib in self._libs.values():
            with contextlib.suppress(ValueError):
                ctypes.c_int64.in_dll(lib, PARALLEL_MIN_MACS_SYMBOL).value = self.parallel_min_macs

    def _with_weights(self, ptrs: list[int], names: list[str], mask: int) -> Callable[[], list[int]]:
        """`ptrs` with the raw weights that the run passes as NULL filled in, for the prepack
        (asked for only when there is packing to do: a bundle's packed weights need none)."""
        return lambda: [
            int(self.array(n).ctypes.data) if mask >> j & 1 else p
            for j, (n, p) in enumerate(zip(names, ptrs, strict=True))
        ]

    def _release(self, names: set[str]) -> None:
        """Drop the raw copies of weights every kernel now reads packed (the plan's too: it is
        this model's own, and its arrays are what `_weights` holds)."""
        for name in sorted(names):
            weight = self._weights.pop(name)
            self.plan.initializers.pop(name, None)
            self._released[name] = int(weight.nbytes)

    def _prepack(self, step: KernelStep, lib: ctypes.CDLL, pointers: Callable[[], list[int]]) -> int | None:
        """The address of `step`'s packed weights, packed now by the kernel's own
        `<symbol>_prepack` (kernel_spec.py) or taken from `packed` (a bundle's), or None for a
        kernel that packs nothing. Call sites with the same kernel and operands share one buffer.
        `pointers()`: the kernel's arguments with every raw weight, for `<symbol>_prepack`."""
        try:
            floats = int(ctypes.c_int64.in_dll(lib, step.symbol + PREPACK_SUFFIX).value)
        except ValueError:  # no such symbol: nothing to pack
            return None
        if not self._packs:
            return 0  # never called: `_require_isa` refuses to run such kernels
        key = (step.symbol, tuple(step.inputs))
        stored = self._stored_packed.get(key)
        if key not in self._packed and stored is not None:
            misaligned = int(stored.ctypes.data) % ALIGNMENT
            if stored.nbytes != floats * 4 or misaligned:
                raise InvalidModelError(
                    f"the stored packed weights of kernel {step.symbol} ({', '.join(step.inputs)}) "
                    f"are {stored.nbytes} bytes, {misaligned} past a {ALIGNMENT}-byte boundary; the "
                    f"kernel takes {floats * 4}, aligned",
                    code="bundle_corrupt",
                    kernel=step.symbol,
                )
            self._packed[key] = stored
        if key not in self._packed:
            absent = sorted({self._root.get(n, n) for n in step.inputs} & set(self._released))
            if absent:
                raise InvalidModelError(
                    f"kernel {step.symbol} has no stored packed weights for {', '.join(step.inputs)} "
                    f"and {absent[0]!r} is not held raw to pack them from",
                    code="bundle_corrupt",
                    kernel=step.symbol,
                )
            ptrs = pointers()
            raw = np.zeros(floats * 4 + ALIGNMENT, dtype=np.uint8)
            shift = (-raw.ctypes.data) % ALIGNMENT
            buf = raw[shift : shift + floats * 4]
            fn = lib[step.symbol + "_prepack"]
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
            fn.restype = None
            argv = (ctypes.c_void_p * max(len(ptrs), 1))(*ptrs)
            fn(argv, int(buf.ctypes.data))
            self._packed[key] = buf
        return int(self._packed[key].ctypes.data)

    def _stats(self) -> dict[str, Any]:
        def extra(step: KernelStep) -> dict[str, Any]:
            info = self.kernels[step.symbol]
            return {"method": info.method, "cached": info.cached}

        common = plan_stats(self.plan, self._steps, lambda s: self.kernels[s].template, extra)
        per_kernel = common.pop("per_kernel")
        return {
            **common,
            "arena_bytes": self.arena_bytes,
            "workspace_bytes": self.workspace_bytes,
            # Raw weights held; those read only packed are released (`released_weights_bytes`).
            "weights_bytes": int(sum(w.nbytes for w in self._weights.values())),
            "released_weights_bytes": int(sum(self._released.values())),
            # Weights packed for the contraction library (contraction/), packed at load or mapped
            # from a bundle (`packed_weights_source`).
            "packed_weights_bytes": int(sum(b.nbytes for b in self._packed.values())),
            "packed_weights_source": self._packed_source(),
            "threads": self.threads,
            # what runs the kernels' parallel loops: "pool" (threadpool/) or "openmp" (libgomp)
            "thread_pool": self.thread_pool,
            # multiply-adds below which a contraction loop leaves the team asleep (threads.py)
            "parallel_min_macs": self.parallel_min_macs,
            "isa": self.isa.name,
            "per_kernel": per_kernel,
        }

    def _packed_source(self) -> str:
        """Where the packed weights came from: "bundle", "packed at load", "mixed" or "none"."""
        stored = sum(1 for k, b in self._packed.items() if self._stored_packed.get(k) is b)
        if not self._packed:
            return "none"
        return "bundle" if stored == len(self._packed) else "packed at load" if not stored else "mixed"

    @property
    def model(self) -> onnx.ModelProto:
        """The fused model the kernels were generated from, every weight included (read back
        from `model_file` when the runtime does not hold it)."""
        if self._model is not None:
            return self._model
        assert self.model_file is not None
        return onnx.load_model(str(self.model_file))

    @property
    def released_weights(self) -> list[str]:
        """The weights held only packed, never raw (bundle.py lists them in the manifest)."""
        return sorted(self._released)

    @property
    def packed_weights(self) -> dict[PackedKey, np.ndarray]:
        """The packed weight buffers by (kernel symbol, operand names), for bundle.py to save."""
        return dict(self._packed)

    # -- running -------------------------------------------------------------------------------
    def poison(self, seed: int = 0) -> None:
        """Fill the arena and scratch buffers with garbage, so a read of unwritten memory shows.

        Seed 0 writes 0xFF bytes (NaN in every float, -1 in every integer), seed 1 0x7F bytes
        (~3.4e38, INT_MAX-like), any other seed random bytes. A kernel that reads memory no
        kernel wrote then gives NaN, or outputs that change with the seed: two runs with
        different seeds must agree exactly. Inputs are copied in after this, weights untouched.
        In the sanitizer debug mode every run does this first, with the next seed.
        """
        with self._lock:
            self._fill(seed)

    def _fill(self, seed: int) -> None:
        for buf in (self._arena, *self._scratch.values()):
            if seed in (0, 1):
                buf.fill(0xFF if seed == 0 else 0x7F)
            else:
                buf[...] = np.random.default_rng(seed).integers(0, 256, buf.shape, dtype=np.uint8)

    def _guard(self, step: int | None) -> None:
        """ASan view of the arena at `step`: only buffers live there are addressable (None: all)."""
        base, size = int(self._arena.ctypes.data), int(self._arena.nbytes)
        if step is None:
            sanitize.unpoison(base, size)
            return
        sanitize.poison(base, size)
        sanitize.unpoison(base + self._workspace_offset, self.workspace_bytes)
        for name, (nbytes, first, last) in self._extents.items():
            if first <= step <= last:
                sanitize.unpoison(base + self._offsets[name], nbytes)

    def run(self, inputs: Mapping[str, Any] | Sequence[Any] | np.ndarray) -> dict[str, np.ndarray]:
        """Run the model: inputs by name (dict) or position; outputs by name, in model order."""
        self._require_isa()
        feeds = self._check_inputs(inputs)
        with self._lock:
            if self.sanitize:
                self._guard(None)
                self._fill(self._runs)
                self._runs += 1
            for name, _, _, view in self._input_views:
                np.copyto(view, feeds[name], casting="no")
            threads = self.team.threads_for_run()
            set_omp_threads(threads)
            started = time.perf_counter()
            self._execute()
            self.team.record(threads, time.perf_counter() - started)
            return {name: view.copy() for name, view in self._output_views}

    def _require_isa(self) -> None:
        """Refuse (`isa_mismatch`) to call kernels this host cannot execute: SIGILL would kill
        the process, and with it a worker or a service, instead of failing one request. The host
        does not change under a running process (`host_isa` is read once), so the answer is
        worked out once."""
        missing = self._isa_missing
        if missing is None:
            missing = self._isa_missing = self.isa.missing_on(host_isa())
        if missing:
            host = host_isa()
            raise IsaMismatchError(
                f"the kernels were built for {self.isa.name} and this host ({host.name}) lacks "
                f"{', '.join(missing)}: they can be saved as a bundle for a host that has it, not run "
                f"here (to run here, build for this host: unset {ISA_ENV} or set it to `host`)",
                isa=self.isa.name,
                host_isa=host.name,
            )

    def _execute(self) -> None:
        if self.sanitize:
            try:
                self._execute_guarded()
            finally:
                self._guard(None)
            return
        if self.dispatch == "ctypes":
            self._execute_per_kernel()
            return
        driver = self._driver
        for kind, payload in self._segments:
            if kind == "kernels":
                n, fns, args = payload
                driver(n, fns, args)
            else:
                self._run_host(*payload)

    @staticmethod
    def _run_host(op: HostOp, ins: list[np.ndarray], outs: list[np.ndarray]) -> None:
        results = op(ins)
        for out, res in zip(outs, results, strict=True):
            if res.shape != out.shape:
                raise host_shape_error(op, res.shape, out.shape)
            np.copyto(out, res, casting="unsafe")

    def profile(
        self, inputs: Mapping[str, Any] | Sequence[Any] | np.ndarray, reps: int = 5
    ) -> list[dict[str, Any]]:
        """Median (`ms`) and fastest (`min_ms`) time of every kernel and host op over `reps` runs,
        in execution order.

        One untimed run comes first (it pays for page faults on the arena and cold weights). On a
        shared machine compare `min_ms` (the kernel) rather than `ms` (the kernel and its
        neighbours), and compare two plans by interleaving their runs: profiled one after the
        other on a busy machine, the same BERT FFN kernel (one symbol, in both plans) measured 9.5
        vs 7.6 ms; interleaved, its fastest runs were within 3%.
        """
        self._require_isa()
        feeds = self._check_inputs(inputs)
        rows: list[dict[str, Any]] = []
        with self._lock:
            for name, value in feeds.items():
                np.copyto(self.array(name), value, casting="no")
            set_omp_threads(self.threads)
            times: list[list[float]] = []
            for _ in range(max(1, reps) + 1):
                kernels = iter(self._per_kernel)
                names = iter(s for s in self._steps if isinstance(s, KernelStep))
                lap: list[float] = []
                rows = []
                for kind, payload in self._segments:
                    if kind == "kernels":
                        for _ in range(payload[0]):
                            fn, argv = next(kernels)
                            step = next(names)
                            t0 = time.perf_counter()
                            fn(argv)
                            lap.append(time.perf_counter() - t0)
                            rows.append(
                                {
                                    "node": step.node_name,
                                    "symbol": step.symbol,
                                    "template": self.kernels[step.symbol].template,
                                }
                            )
                    else:
                        op, ins, outs = payload
                        t0 = time.perf_counter()
                        for out, res in zip(outs, op(ins), strict=True):
                            np.copyto(out, res, casting="unsafe")
                        lap.append(time.perf_counter() - t0)
                        rows.append({"node": op.node.name, "symbol": "", "template": "host"})
                times.append(lap)
        times = times[1:]  # the warm-up run
        for k, row in enumerate(rows):
            row["ms"] = round(float(np.median([t[k] for t in times])) * 1e3, 4)
            row["min_ms"] = round(min(t[k] for t in times) * 1e3, 4)
        return rows

    def _execute_guarded(self) -> None:
        """One kernel or host op at a time, each seeing only the buffers live at its step."""
        kernels = iter(self._per_kernel)
        steps = [k for k, s in enumerate(self._steps) if not isinstance(s, ViewStep)]
        order = iter(steps)
        for kind, payload in self._segments:
            if kind == "kernels":
                for _ in range(payload[0]):
                    fn, argv = next(kernels)
                    self._guard(next(order))
                    fn(argv)
            else:
                self._guard(None)  # numpy's copies are not instrumented: no partial view for them
                next(order)
                self._run_host(*payload)

    def _execute_per_kernel(self) -> None:
        """One ctypes call per kernel (kept to measure what the driver saves)."""
        kernels = iter(self._per_kernel)
        for kind, payload in self._segments:
            if kind == "kernels":
                for _ in range(payload[0]):
                    fn, argv = next(kernels)
                    fn(argv)
            else:
                op, ins, outs = payload
                for out, res in zip(outs, op(ins), strict=True):
                    np.copyto(out, res, casting="unsafe")

    def _check_inputs(self, inputs: Mapping[str, Any] | Sequence[Any] | np.ndarray) -> dict[str, np.ndarray]:
        """`check_inputs`, after a fast pass for the usual call (a dict of exactly the model's
        inputs, each an ndarray of the right dtype and shape), which accepts what it would and
        costs a fifth of it; anything else takes the full checks and their errors."""
        if type(inputs) is dict and len(inputs) == len(self._input_views):
            feeds = {}
            for name, dtype, shape, _ in self._input_views:
                value = inputs.get(name)
                if type(value) is not np.ndarray or value.dtype != dtype or value.shape != shape:
                    break
                feeds[name] = value
            else:
                return feeds
        return check_inputs(self.plan.inputs, inputs)

    # -- persistence ---------------------------------------------------------------------------
    def save_bundle(self, path: str | Path) -> Path:
        """Write the model, its kernels and a manifest (a directory, or .tar.gz/.tgz)."""
        from .bundle import save_bundle

        return save_bundle(self, path)

    def close(self) -> None:
        """Drop references to the arena and kernels (the shared objects stay mapped)."""
        with contextlib.suppress(AttributeError):
            del self._segments, self._per_kernel, self._argvs
