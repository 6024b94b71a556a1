"""Hardware profiles: the numbers the roofline cost model needs.

`cpu` is measured on the host the first time it is asked for (a STREAM-like copy for bandwidth,
an sgemm for peak flops) and cached on disk, because the planner must not spend a second on it per
job and the figures differ from machine to machine. `ascend910` and the `cuda` profiles (one per
compute capability, `cuda` itself being the device present or sm80) come from published figures.

The accelerator fields size the Triton kernels (backend/triton/blocks.py): `cores` bounds an
Ascend grid (one program per AI core), `unified_buffer_bytes` bounds a block's working set there,
`cube_tile` is the matrix unit's native tile, `shared_memory_bytes` bounds a CUDA GEMM's staged
tiles, and `num_warps` is None where the target has no warps (Ascend).
"""

from __future__ import annotations

import json
import os
import platform
import time
from functools import cache
from pathlib import Path

import numpy as np
from pydantic import BaseModel

from .errors import InvalidConfigError


class HardwareProfile(BaseModel):
    name: str
    peak_flops: float  # fp32 FLOP/s reachable by a tuned contraction on all cores
    memory_bandwidth: float  # bytes/s, sustained
    launch_overhead: float  # seconds per kernel launch (call + parallel fork/join)
    anchor_efficiency: float = 0.8  # fraction of peak a generated anchor kernel reaches
    chain_efficiency: float = 0.85  # extra factor when two contractions share a kernel (smaller tiles)
    cores: int = 1
    isa: str = ""  # the instruction set the host offers (`isa.host_isa()`), for a measured profile
    source: str = ""
    # Accelerator targets (Triton kernels); None/0 on the CPU.
    compute_capability: tuple[int, int] | None = None  # CUDA sm major/minor
    shared_memory_bytes: int = 0  # per block (CUDA), the staging budget of a GEMM's tiles
    unified_buffer_bytes: int = 0  # per AI core (Ascend): every block's working set must fit
    cube_tile: tuple[int, int] | None = None  # native matrix-unit tile (Ascend cube: 16x16 fp16)
    num_warps: int | None = None  # warps per program; None where the target has none (Ascend)
    fp64: bool = True  # whether the target computes in fp64 (accumulators narrow to fp32 if not)


# Huawei Ascend 910: 256 TFLOPS fp16 (cube units) and 1.2 TB/s HBM2 bandwidth, as published in
# H. Liao et al., "DaVinci: A Scalable Architecture for Neural Network Computing", Hot Chips 31
# (2019), and Huawei's Ascend 910 product announcement (Aug 2019). fp32 throughput on the cube is
# a quarter of fp16 in that architecture; the launch overhead is an estimate for a CANN kernel
# launch (task dispatch from the host), not a published figure.
ASCEND910 = HardwareProfile(
    name="ascend910",
    peak_flops=64e12,
    memory_bandwidth=1.2e12,
    launch_overhead=5e-6,
    anchor_efficiency=0.7,
    chain_efficiency=0.9,
    cores=32,
    source="Liao et al., DaVinci, Hot Chips 31 (2019): 256 TFLOPS fp16, 1.2 TB/s HBM; fp32 = fp16/4",
    # triton-ascend: the grid is sized to the AI cores; a vector block lives in the Unified Buffer,
    # budgeted at 192 KB (the AI vector core's UB in the 910B generation); the cube computes 16x16
    # fp16 fractals; there is no warp concept, so kernels are launched without num_warps.
    unified_buffer_bytes=192 * 1024,
    cube_tile=(16, 16),
    num_warps=None,
    fp64=False,
)


def _cuda(
    sm: tuple[int, int], gpu: str, fp32_tflops: float, tb_s: float, sms: int, smem_kb: int
) -> HardwareProfile:
    return HardwareProfile(
        name=f"cuda_sm{sm[0]}{sm[1]}",
        peak_flops=fp32_tflops * 1e12,
        memory_bandwidth=tb_s * 1e12,
        launch_overhead=4e-6,  # a Triton launch from Python (measured figures are 3-5 us)
        anchor_efficiency=0.7,
        chain_efficiency=0.9,
        cores=sms,
        source=f"NVIDIA {gpu} datasheet: {fp32_tflops} TFLOPS fp32, {tb_s} TB/s, {sms} SMs, "
        f"{smem_kb} KB shared memory per block",
        compute_capability=sm,
        shared_memory_bytes=smem_kb * 1024,
        num_warps=4,
    )


#: CUDA profiles by compute capability (NVIDIA datasheets of the reference part of each).
CUDA_PROFILES: dict[tuple[int, int], HardwareProfile] = {
    (7, 0): _cuda((7, 0), "V100 SXM2", 15.7, 0.9, 80, 96),
    (8, 0): _cuda((8, 0), "A100 SXM 80GB", 19.5, 2.0, 108, 163),
    (8, 6): _cuda((8, 6), "A10", 31.2, 0.6, 72, 99),
    (8, 9): _cuda((8, 9), "L4", 30.3, 0.3, 58, 99),
    (9, 0): _cuda((9, 0), "H100 SXM", 67.0, 3.35, 132, 227),
}
DEFAULT_CUDA_CAPABILITY = (8, 0)


def cuda_profile(capability: tuple[int, int] | None = None) -> HardwareProfile:
    """The profile of compute capability `capability`; by default the device present (through
    torch, when it sees one), else sm80. An unlisted capability takes the nearest listed one
    below it (same major version first), renamed for what it is."""
    if capability is None:
        capability = _present_capability() or DEFAULT_CUDA_CAPABILITY
    if capability in CUDA_PROFILES:
        return CUDA_PROFILES[capability]
    below = [c for c in CUDA_PROFILES if c <= capability] or [min(CUDA_PROFILES)]
    base = CUDA_PROFILES[max(below)]
    return base.model_copy(
        update={"name": f"cuda_sm{capability[0]}{capability[1]}", "compute_capability": capability}
    )


def _present_capability() -> tuple[int, int] | None:
    try:
        import torch  # an optional dependency: only accelerator hosts and the dev extra have it
    except ImportError:
        return None
    try:
        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            return int(major), int(minor)
    except Exception:  # a broken driver says nothing about the profile: fall back
        return None
    return None


def _cache_file() -> Path:
    root = os.environ.get("AUTOFUSION_CACHE_DIR") or os.path.join(Path.home(), ".cache", "graph_autofusion")
    return Path(root) / "hardware-cpu.json"


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (the platform's processor string elsewhere): every
    benchmark prints it, since a figure means nothing without its host."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            found = model_from_cpuinfo(f.read())
        if found:
            return found
    except OSError:
        pass
    return platform.processor() or platform.machine()


def model_from_cpuinfo(text: str) -> str | None:
    """The first processor's model name in /proc/cpuinfo's text, with its x86 family and model
    numbers where given: virtual machines often report only a generic name ("AMD EPYC", "Intel
    Xeon Processor") for CPUs as far apart as Zen 3 with AVX2 and Zen 5 with full-width
    AVX-512, and the numbers tell them apart (family 25 is Zen 3/4, 26 Zen 5)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor's block is enough
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name")
    if not name:
        return None
    family, model = fields.get("cpu family"), fields.get("model")
    if family and model and family.isdigit() and model.isdigit():
        return f"{name} (family {family}, model {model})"
    return name


def host_isa_name() -> str:
    """The instruction set this host offers, as the kernel compiler names it (`x86-64-v3`)."""
    from .backend.cpu.isa import host_isa  # late: the backend imports this module's neighbours

    return host_isa().name


def describe_host() -> str:
    """One line naming the host: CPU model, CPU count, the ISA it offers and the one kernels are
    built for. Every benchmark prints it in its header (a figure means nothing without its host,
    and our hosts change between AVX2 and AVX-512 machines), and `autofusion hardware` shows it."""
    from .backend.cpu.isa import target_isa

    host = host_isa_name()
    target = target_isa().name
    built = "kernels built for it" if target == host else f"kernels built for {target}"
    return f"host: {cpu_model()}, {os.cpu_count()} CPUs, ISA {host} ({built})"


def _host_key() -> str:
    return f"{cpu_model()}|{os.cpu_count()}|{host_isa_name()}"


def _median_seconds(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def measure_cpu() -> HardwareProfile:
    """Measure bandwidth (copy of 64 MiB) and peak flops (512³ sgemm); ~0.3 s."""
    src = np.ones(16 * 1024 * 1024, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    t_copy = _median_seconds(lambda: np.copyto(dst, src), 5)
    bandwidth = 2 * src.nbytes / t_copy
    a = np.ones((512, 512), dtype=np.float32)
    a @ a
    t_mm = _median_seconds(lambda: a @ a, 5)
    flops = 2 * 512**3 / t_mm
    return HardwareProfile(
        name="cpu",
        peak_flops=flops,
        memory_bandwidth=bandwidth,
        launch_overhead=3e-6,
        cores=os.cpu_count() or 1,
        isa=host_isa_name(),
        source=f"measured on this host ({_host_key()})",
    )


@cache
def cpu_profile() -> HardwareProfile:
    path = _cache_file()
    key = _host_key()
    try:
        data = json.loads(path.read_text())
        if data.get("host") == key:
            return HardwareProfile.model_validate(data["profile"])
    except (OSError, ValueError, KeyError):
        pass
    profile = measure_cpu()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"host": key, "profile": profile.model_dump()}))
        os.replace(tmp, path)
    except OSError:
        pass  # an unwritable cache only costs a re-measurement next time
    return profile


PROFILES = {
    "ascend910": lambda: ASCEND910,
    "cpu": cpu_profile,
    "cuda": cuda_profile,
    **{p.name: (lambda p=p: p) for p in CUDA_PROFILES.values()},
}


def get_profile(name: str) -> HardwareProfile:
    try:
        return PROFILES[name]()
    except KeyError:
        raise InvalidConfigError(
            f"unknown hardware profile {name!r}; known: {', '.join(sorted(PROFILES))}",
            code="unknown_hardware",
        ) from None
