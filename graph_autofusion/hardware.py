"""Hardware profiles: the numbers the roofline cost model needs.

`cpu` is measured on the host the first time it is asked for (a STREAM-like copy for bandwidth,
an sgemm for peak flops) and cached on disk, because the planner must not spend a second on it per
job and the figures differ from machine to machine. `ascend910` comes from published figures.
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
)


def _cache_file() -> Path:
    root = os.environ.get("AUTOFUSION_CACHE_DIR") or os.path.join(Path.home(), ".cache", "graph_autofusion")
    return Path(root) / "hardware-cpu.json"


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (the platform's processor string elsewhere): every
    benchmark prints it, since a figure means nothing without its host."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


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


PROFILES = {"ascend910": lambda: ASCEND910, "cpu": cpu_profile}


def get_profile(name: str) -> HardwareProfile:
    try:
        return PROFILES[name]()
    except KeyError:
        raise InvalidConfigError(
            f"unknown hardware profile {name!r}; known: {', '.join(sorted(PROFILES))}",
            code="unknown_hardware",
        ) from None
