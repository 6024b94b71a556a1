"""Runtime speed on every zoo model: our compiled kernels, unfused and fused, against onnxruntime
and OpenVINO.

The header names the host (CPU model, the ISA it offers and the ISA kernels are built for:
`hardware.describe_host`) and the peers' versions. For each model (full size unless `--small`),
one line with the median latency (ms) of

- ours unfused (every op its own kernel: `fuse(model, FusionConfig(max_fusion_size=0)).model`),
- ours fused (`fuse(model).model`),
- onnxruntime with ORT_DISABLE_ALL and with ORT_ENABLE_ALL (same thread count),
- OpenVINO's CPU plugin (`pip install -e '.[bench]'`; the column is `-` without it) on the same
  canonical model and inputs: INFERENCE_NUM_THREADS = the thread count, INFERENCE_PRECISION_HINT
  f32 (no bf16 on hosts that have it), PERFORMANCE_HINT LATENCY, dynamic quantization and CPU
  pinning off (see `OPENVINO_CONFIG`),

the ratios fused/unfused, fused/ORT_ENABLE_ALL and fused/OpenVINO (below 1.0: we are faster),
the same two ratios of the fastest runs (`min f/ort`, `min f/ov`: the medians say how each
contender fares on the host as it is, the fastest runs how the kernels compare when the host
lets them run: on a 2-vCPU AMD EPYC host with busy neighbours one run read ResNet-50 at 1.18x
onnxruntime by the medians and 1.06x by the fastest runs, MobileNetV2 at 0.72x and 1.09x),
OpenVINO's largest error against onnxruntime relative to the output's largest magnitude (`ov err`;
a row whose OpenVINO outputs disagree beyond 1e-3 is marked `!`, its timing then compares
different computations), the share of the
unfused run spent in anchor kernels (Conv, MatMul, Gemm: `anchor%`, from `CompiledModel.profile`),
which bounds what fusion can gain (fused/unfused cannot go below it while the anchors run at the
same speed in both plans), the arena peak fused vs unfused, the cold compile time of the fused
model (an empty kernel cache), the warm load time (every kernel already cached) and `f 1thr`:
how many of the fused model's runs in the rounds the adaptive team (backend/cpu/team.py) gave
one thread instead of the full team, out of its runs there (a fused median taken from one-thread
runs says how the policy coped with a slow stretch of the host, not how fast the kernels are:
on an Intel Xeon host MobileNetV2 takes 6.6-7.0 ms on one thread and 4.5-4.9 on two, so a few
such runs move its median). All
contenders run in one process, in alternating rounds of consecutive calls (see `block_medians`),
so a noisy neighbour hurts all of them alike and every ratio comes from the same run.

`--avx2` makes an AVX-512 host stand in for an AVX2 one as far as it can: our kernels are built
for x86-64-v3 (`AUTOFUSION_ISA=v3`) and OpenVINO is capped by oneDNN's `ONEDNN_MAX_CPU_ISA=AVX2`
(ResNet-50 20.0 -> 36.5 ms on an AMD EPYC Zen 5, every convolution then `brgconv_avx2`). The cap
does not reach everything: OpenVINO's fully connected layers may run MLAS, which picks its ISA by
CPUID, and some of its own JIT kernels (MVN) stay AVX-512, so each row gives the share of
OpenVINO's profiled time in such kernels (`ov>avx2`, `openvino_isa_times`): `f/ov` compares AVX2
with AVX2 only where that share is small (the conv nets, not BERT-base, whose MLAS GEMMs are 37-39%
of it). onnxruntime has no switch at all (MLAS again), so its columns stay AVX-512. The header
probes a convolution and stops the run if even oneDNN ignores the cap. The silicon stays the
AVX-512 host's (its caches, its clock, its FMA units used at half width): these figures add to an
AVX2 host's, they do not replace them.

`--style dynamo` builds the zoo as torch's dynamo exporter writes it (zoo.py) instead of the
TorchScript exporter's graphs: what a user of torch.onnx.export's default now brings.

Run: `.venv/bin/python benchmarks/runtime_speed.py [--models resnet50,bert_base] [--threads 2]
[--reps 20] [--small] [--avx2] [--style dynamo] [--json]` (with `--json` the header goes to
stderr and every row carries the host line).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

import graph_autofusion as gaf
from graph_autofusion import FusionConfig, zoo
from graph_autofusion.backend.cpu.cache import KernelCache
from graph_autofusion.backend.cpu.runtime import compile_model
from graph_autofusion.hardware import describe_host

MODELS = ["resnet50", "mobilenet_v2", "bert_base", "gpt2", "vit_b16", "mlp"]
# Variants small enough for a smoke run of the script itself (`--small`).
SMALL = {
    "resnet50": {"image_size": 64, "width": 16, "layers": (1, 1, 1, 1), "num_classes": 10},
    "mobilenet_v2": {"image_size": 64, "width_mult": 0.5, "num_classes": 10},
    "bert_base": {"num_layers": 2, "hidden": 128, "heads": 2, "seq_len": 32, "vocab": 500},
    "gpt2": {"num_layers": 2, "hidden": 128, "heads": 2, "seq_len": 32, "vocab": 500, "max_positions": 64},
    "vit_b16": {"image_size": 64, "patch": 16, "num_layers": 2, "hidden": 128, "heads": 2, "num_classes": 10},
    "mlp": {},
}


def ort_session(
    model: onnx.ModelProto, level: ort.GraphOptimizationLevel, threads: int
) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = level
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


# OpenVINO CPU settings: the same thread budget as everyone else, fp32 arithmetic (no bf16 or
# dynamically quantized int8 on hosts that have AMX/VNNI), one stream tuned for latency, and
# threads left unpinned like ours and onnxruntime's: on a shared 2-vCPU machine a pinned thread
# waits for its busy core (small BERT, interleaved: median 4.6 ms pinned, 0.85 ms unpinned).
OPENVINO_CONFIG = {
    "INFERENCE_PRECISION_HINT": "f32",
    "PERFORMANCE_HINT": "LATENCY",
    "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0,
    "ENABLE_CPU_PINNING": False,
}
OV_AGREEMENT = 1e-3  # OpenVINO vs onnxruntime, relative to the output's largest magnitude

# `--avx2`: the environment that builds our kernels for x86-64-v3 and caps OpenVINO's oneDNN at
# AVX2. Both are read when first used, so `cap_at_avx2` runs before any kernel or OpenVINO model.
AVX2_ENVIRONMENT = {"AUTOFUSION_ISA": "v3", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def cap_at_avx2() -> None:
    """Build our kernels for x86-64-v3 and cap OpenVINO at AVX2 in this process (see `--avx2`)."""
    os.environ.update(AVX2_ENVIRONMENT)


# What a kernel name of OpenVINO's profile says of the code it runs: oneDNN's and OpenVINO's own
# kernels name their ISA (`brgconv_avx2_f32`, `jit_avx512_f32`); its fully connected layers may
# run MLAS (`gemm_mlas_f32`), which picks its ISA by CPUID as onnxruntime's does: no cap reaches it.
OV_KERNEL_ISAS = ("avx512", "amx", "avx2", "sse41", "mlas")
OV_UNCAPPED = ("avx512", "amx", "mlas")  # on an AVX-512 host under `--avx2`: not AVX2 code


def openvino_isa_times(model: onnx.ModelProto, feeds: Mapping, threads: int) -> dict[str, float]:
    """Milliseconds of one profiled OpenVINO run (`PERF_COUNT`, after a warm-up) by the ISA its
    nodes' kernel names give (`OV_KERNEL_ISAS`, else `other`: reorders, reference kernels). What
    `--avx2` checks its cap by: OpenVINO's reported capabilities do not change under the cap,
    and some of its kernels ignore it (on a Zen 5 host, BERT-base's MLAS GEMMs, 37-39% of its time,
    and its MVN nodes stayed AVX-512 while every convolution and brgemm went AVX2)."""
    import openvino as ov

    core = ov.Core()
    compiled = core.compile_model(
        core.read_model(model.SerializeToString(), b""),
        "CPU",
        {**OPENVINO_CONFIG, "INFERENCE_NUM_THREADS": threads, "PERF_COUNT": True},
    )
    request = compiled.create_infer_request()
    request.infer(dict(feeds))
    request.infer(dict(feeds))
    times: dict[str, float] = {}
    for info in request.get_profiling_info():
        isa = next((name for name in OV_KERNEL_ISAS if name in info.exec_type), "other")
        times[isa] = times.get(isa, 0.0) + info.real_time.total_seconds() * 1e3
    return times


def isa_probe_model() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A one-convolution model (16 -> 32 channels, 3x3, 16x16) and its input: enough for
    OpenVINO to pick a oneDNN kernel that names its ISA."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    values = rng.standard_normal(32 * 16 * 3 * 3).astype(np.float32).tobytes()
    weight = helper.make_tensor("w", TensorProto.FLOAT, [32, 16, 3, 3], values, raw=True)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
        "isa_probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 16, 16])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, {"x": np.ones((1, 16, 16, 16), np.float32)}


def openvino_version() -> str | None:
    """OpenVINO's version, or None when it is not installed (the column is then left out)."""
    try:
        import openvino
    except ImportError:
        return None
    return openvino.__version__.split("-")[0]


def openvino_runner(model: onnx.ModelProto, threads: int, workdir: Path) -> Callable[[Mapping], list]:
    """OpenVINO's CPU plugin compiled for `model`: a callable from feeds to outputs in graph order."""
    import openvino as ov

    path = workdir / "openvino-input.onnx"
    onnx.save(model, path, save_as_external_data=model.ByteSize() > 1 << 30)
    core = ov.Core()
    compiled = core.compile_model(
        core.read_model(str(path)), "CPU", {**OPENVINO_CONFIG, "INFERENCE_NUM_THREADS": threads}
    )
    request = compiled.create_infer_request()
    names = [o.name for o in model.graph.output]
    ports = {name: next(p for p in compiled.outputs if name in p.get_names()) for name in names}

    def run(feeds: Mapping) -> list:
        result = request.infer(dict(feeds))
        return [result[ports[name]] for name in names]

    return run


def relative_error(got: Sequence[np.ndarray], expected: Sequence[np.ndarray]) -> float:
    """Largest |got - expected| per output over that output's largest |expected|, worst output."""
    worst = 0.0
    for g, e in zip(got, expected, strict=True):
        e64, g64 = np.asarray(e, np.float64), np.asarray(g, np.float64)
        scale = max(float(np.max(np.abs(e64))), 1e-30) if e64.size else 1.0
        worst = max(worst, float(np.max(np.abs(g64 - e64))) / scale if e64.size else 0.0)
    return worst


# A block lasts at least this long: six calls of a 20 us MLP are over before a woken thread pool
# settles, and their median swung 1.0-1.3x onnxruntime from one run of the script to the next.
MIN_BLOCK_SECONDS = 0.05
# Seconds of quiet before each block, so that the previous contender's idle workers have stopped
# spinning: onnxruntime's keep one of two vCPUs busy for 50-100 ms after its last run. Our fused
# MobileNetV2 (about 6 ms alone, adaptive team off), run once after three onnxruntime runs and a
# pause, took a median of 10.0-13.1 ms after pauses of 0-50 ms and 7.6-7.7 ms after 100-300 ms
# (AMD EPYC, 2 vCPUs), and OpenVINO's MobileNetV2, whose blocks follow onnxruntime's, 9.8 ms a
# run without the pause against 5.5-7.2 with it: without it a block's timed calls pay for the
# previous contender's threads.
SETTLE_SECONDS = 0.3


def block_medians(
    runners: dict[str, Callable[[], Any]],
    reps: int,
    rounds: int = 3,
    settle: float = SETTLE_SECONDS,
    pace: float = 0.0,
) -> dict[str, float]:
    """Median wall time (ms) of each runner over `rounds` rounds of calls (`block_times`)."""
    times = block_times(runners, reps, rounds, settle, pace)
    return {name: statistics.median(values) for name, values in times.items()}


def block_times(
    runners: dict[str, Callable[[], Any]],
    reps: int,
    rounds: int = 3,
    settle: float = SETTLE_SECONDS,
    pace: float = 0.0,
) -> dict[str, list[float]]:
    """Wall times (ms) of each runner's timed calls over `rounds` rounds of consecutive calls.

    Each round runs every contender in turn, a block of calls each after `settle` seconds of
    quiet (the first call of a block is a warm-up and not timed): alternating rounds spread a
    noisy neighbour over all of them, while the pause and the blocks keep one runtime's idle
    thread pool (onnxruntime's workers spin for 50-100 ms after a run, SETTLE_SECONDS) from
    stealing the cores of the next contender's timed calls. A block holds `reps // rounds`
    calls, and more while it has lasted under `MIN_BLOCK_SECONDS`. With `pace`, each call comes
    `pace` seconds after the one before (a service's requests: benchmarks/thread_pool.py).
    """
    times: dict[str, list[float]] = {name: [] for name in runners}
    per_round = max(1, reps // rounds)
    for _ in range(rounds):
        for name, run in runners.items():
            time.sleep(settle)
            run()
            calls, began = 0, time.perf_counter()
            while calls < per_round or time.perf_counter() - began < MIN_BLOCK_SECONDS:
                if pace > 0:
                    time.sleep(pace)
                t0 = time.perf_counter()
                run()
                times[name].append((time.perf_counter() - t0) * 1e3)
                calls += 1
    return times


def measure(
    name: str,
    *,
    threads: int,
    reps: int,
    small: bool,
    openvino: bool,
    avx2: bool = False,
    style: str = "torchscript",
) -> dict[str, Any]:
    source = zoo.build(name, style=style, **(SMALL[name] if small else {}))
    feeds = zoo.example_inputs(source)
    unfused = gaf.fuse(source, config=FusionConfig(max_fusion_size=0))
    fused = gaf.fuse(source)
    reference = fused.canonical_reference
    with tempfile.TemporaryDirectory(prefix="autofusion-bench-") as tmp:
        cache = KernelCache(tmp)
        t0 = time.perf_counter()
        ours_fused = compile_model(fused.model, cache=cache, threads=threads)
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        compile_model(fused.model, cache=cache, threads=threads)
        warm = time.perf_counter() - t0
        ours_unfused = compile_model(unfused.model, cache=cache, threads=threads)
        disable_all = ort_session(reference, ort.GraphOptimizationLevel.ORT_DISABLE_ALL, threads)
        enable_all = ort_session(reference, ort.GraphOptimizationLevel.ORT_ENABLE_ALL, threads)
        expected = enable_all.run(None, feeds)
        got = ours_fused(feeds)
        max_abs = max(float(np.max(np.abs(g - e))) for g, e in zip(got.values(), expected, strict=True))
        contenders: dict[str, Callable[[], Any]] = {
            "unfused": lambda: ours_unfused(feeds),
            "fused": lambda: ours_fused(feeds),
            "ort_disable_all": lambda: disable_all.run(None, feeds),
            "ort_enable_all": lambda: enable_all.run(None, feeds),
        }
        ov_err, uncapped = None, None
        if openvino:
            if avx2:
                isa_ms = openvino_isa_times(reference, feeds, threads)
                uncapped = sum(isa_ms.get(isa, 0.0) for isa in OV_UNCAPPED) / sum(isa_ms.values())
            ov_run = openvino_runner(reference, threads, Path(tmp))
            ov_err = relative_error(ov_run(feeds), expected)
            contenders["openvino"] = lambda: ov_run(feeds)
        profile = ours_unfused.profile(feeds, reps=3)
        total_ms = sum(r["min_ms"] for r in profile)
        anchor_ms = sum(r["min_ms"] for r in profile if r["template"] == "anchor")
        anchor_share = anchor_ms / total_ms if total_ms else 0.0
        before = Counter(ours_fused.team.runs)
        times = block_times(contenders, reps)
        medians = {name: statistics.median(values) for name, values in times.items()}
        fastest = {name: min(values) for name, values in times.items()}
        chosen = ours_fused.team.runs - before  # the team sizes of the fused model's runs in the rounds
    return {
        "model": name,
        "host": describe_host(),
        "threads": threads,
        "onnx_nodes": len(source.graph.node),
        "kernels_unfused": ours_unfused.stats["kernels"],
        "kernels_fused": ours_fused.stats["kernels"],
        "host_ops_fused": len(ours_fused.stats["host_ops"]),
        **{f"{k}_ms": round(v, 3) for k, v in medians.items()},
        "fused_vs_unfused": round(medians["fused"] / medians["unfused"], 3),
        "fused_vs_ort_enable_all": round(medians["fused"] / medians["ort_enable_all"], 3),
        "fused_vs_openvino": round(medians["fused"] / medians["openvino"], 3) if openvino else None,
        **{f"{k}_fastest_ms": round(v, 3) for k, v in fastest.items()},
        "fastest_fused_vs_ort_enable_all": round(fastest["fused"] / fastest["ort_enable_all"], 3),
        "fastest_fused_vs_openvino": round(fastest["fused"] / fastest["openvino"], 3) if openvino else None,
        "openvino_rel_err_vs_ort": ov_err,
        # `--avx2`: the share of OpenVINO's profiled time in kernels no cap reaches (OV_UNCAPPED)
        "openvino_uncapped_share": None if uncapped is None else round(uncapped, 3),
        "unfused_anchor_share": round(anchor_share, 3),
        "arena_unfused_bytes": ours_unfused.stats["arena_bytes"],
        "arena_fused_bytes": ours_fused.stats["arena_bytes"],
        "cold_compile_s": round(cold, 2),
        "warm_load_s": round(warm, 3),
        "max_abs_err_vs_ort": max_abs,
        "fused_runs": sum(chosen.values()),
        # runs the adaptive team (backend/cpu/team.py) gave fewer threads than `threads`
        "fused_reduced_team_runs": sum(n for t, n in chosen.items() if t < threads),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--small", action="store_true", help="small variants (a smoke run of the script)")
    parser.add_argument("--avx2", action="store_true", help="our kernels and OpenVINO's at AVX2 (see above)")
    parser.add_argument(
        "--style",
        default="torchscript",
        choices=["torchscript", "dynamo"],
        help="the exporter the zoo imitates",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.avx2:
        cap_at_avx2()
    ov_version = openvino_version()
    out = sys.stderr if args.json else sys.stdout
    print(describe_host(), file=out)
    if args.avx2:
        print(avx2_line(bool(ov_version)), file=out)
    print(
        f"onnxruntime {ort.__version__}, "
        + (f"OpenVINO {ov_version}" if ov_version else "OpenVINO not installed (pip install -e '.[bench]')")
        + f"; {args.threads} threads, median of at least {args.reps} runs in alternating rounds"
        + f" (blocks of at least {MIN_BLOCK_SECONDS * 1e3:.0f} ms); {args.style}-style zoo exports",
        file=out,
        flush=True,
    )
    rows = []
    header = (
        f"{'model':<13} {'unfused':>9} {'fused':>9} {'ort-dis':>9} {'ort-all':>9} {'openvino':>9} "
        f"{'f/unf':>6} {'f/ort':>6} {'f/ov':>6} {'min f/ort':>9} {'min f/ov':>8} {'ov err':>8} "
        f"{'anchor%':>7} {'arena unf→fused MB':>19} {'cold s':>7} {'warm s':>7} {'f 1thr':>7}"
    )
    if args.avx2:
        header += f" {'ov>avx2':>7}"
    if not args.json:
        print(header)
    for name in args.models.split(","):
        row = measure(
            name,
            threads=args.threads,
            reps=args.reps,
            small=args.small,
            openvino=bool(ov_version),
            avx2=args.avx2,
            style=args.style,
        )
        row["avx2_cap"] = args.avx2
        row["style"] = args.style
        rows.append(row)
        if not args.json:
            print(format_row(row), flush=True)
    if args.json:
        print(json.dumps(rows, indent=2))


def avx2_line(openvino: bool) -> str:
    """The header line of an `--avx2` run: what each contender runs. Stops the run when not even
    oneDNN's convolution obeys the cap (every `f/ov` would then compare AVX2 with AVX-512)."""
    if not openvino:
        return "AVX2 cap: our kernels x86-64-v3; onnxruntime not capped (MLAS follows CPUID)"
    probe = {isa for isa, ms in openvino_isa_times(*isa_probe_model(), threads=1).items() if ms > 0}
    if "avx2" not in probe or probe & {"avx512", "amx"}:
        raise SystemExit(
            f"--avx2: OpenVINO ignores ONEDNN_MAX_CPU_ISA=AVX2 here (its probe kernels: {sorted(probe)})"
        )
    return (
        "AVX2 cap: our kernels x86-64-v3, OpenVINO ONEDNN_MAX_CPU_ISA=AVX2 (a probe conv: "
        f"{', '.join(sorted(probe))}; `ov>avx2`: the share of its time in kernels the cap does not reach, "
        "MLAS GEMMs and AVX-512 JIT kernels); onnxruntime not capped (MLAS follows CPUID): f/ort is "
        "not AVX2 to AVX2"
    )


def ms(value: float) -> str:
    """A latency in a 9-wide column with three significant digits below 10 ms (an MLP's 0.05 ms
    would otherwise print as 0.05 for both 0.046 and 0.054)."""
    return f"{value:>9.2f}" if value >= 10 else f"{value:>9.3g}"


def format_row(row: dict[str, Any]) -> str:
    arena = f"{row['arena_unfused_bytes'] / 1e6:.1f}→{row['arena_fused_bytes'] / 1e6:.1f}"
    if row.get("openvino_ms") is not None:
        err = row["openvino_rel_err_vs_ort"]
        ov = ms(row["openvino_ms"])
        f_ov = f"{row['fused_vs_openvino']:>6.2f}"
        min_f_ov = f"{row['fastest_fused_vs_openvino']:>8.2f}"
        ov_err = f"{err:>7.1e}" + ("!" if err > OV_AGREEMENT else " ")
    else:
        ov, f_ov, min_f_ov, ov_err = f"{'-':>9}", f"{'-':>6}", f"{'-':>8}", f"{'-':>8}"
    return (
        f"{row['model']:<13} {ms(row['unfused_ms'])} {ms(row['fused_ms'])} "
        f"{ms(row['ort_disable_all_ms'])} {ms(row['ort_enable_all_ms'])} {ov} "
        f"{row['fused_vs_unfused']:>6.2f} {row['fused_vs_ort_enable_all']:>6.2f} {f_ov} "
        f"{row['fastest_fused_vs_ort_enable_all']:>9.2f} {min_f_ov} {ov_err} "
        f"{100 * row['unfused_anchor_share']:>7.1f} {arena:>19} {row['cold_compile_s']:>7.2f} "
        f"{row['warm_load_s']:>7.3f} {row['fused_reduced_team_runs']:>3}/{row['fused_runs']:<3}"
        + (
            f" {100 * uncapped:>6.1f}%"
            if (uncapped := row.get("openvino_uncapped_share")) is not None
            else ""
        )
    )


if __name__ == "__main__":
    main()
