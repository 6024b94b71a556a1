"""Runtime speed on every zoo model: our compiled kernels, unfused and fused, against onnxruntime.

For each model (full size unless `--small`), one line with the median latency (ms) of

- ours unfused (every op its own kernel: `fuse(model, FusionConfig(max_fusion_size=0)).model`),
- ours fused (`fuse(model).model`),
- onnxruntime with ORT_DISABLE_ALL and with ORT_ENABLE_ALL (same thread count),

the ratios fused/unfused and fused/ORT_ENABLE_ALL (below 1.0: we are faster), the share of the
unfused run spent in anchor kernels (Conv, MatMul, Gemm: `anchor%`, from `CompiledModel.profile`),
which bounds what fusion can gain (fused/unfused cannot go below it while the anchors run at the
same speed in both plans), the arena peak fused vs unfused, the cold compile time of the fused
model (an empty kernel cache) and the warm load time (every kernel already cached). The four
contenders run in alternating rounds of consecutive calls (see `block_medians`) so a noisy
neighbour hurts all of them alike.

Run: `.venv/bin/python benchmarks/runtime_speed.py [--models resnet50,bert_base] [--threads 2]
[--reps 20] [--small] [--json]`
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

import graph_autofusion as gaf
from graph_autofusion import FusionConfig, zoo
from graph_autofusion.backend.cpu.cache import KernelCache
from graph_autofusion.backend.cpu.runtime import compile_model

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


def block_medians(runners: dict[str, Callable[[], Any]], reps: int, rounds: int = 3) -> dict[str, float]:
    """Median wall time (ms) of each runner over `rounds` rounds of consecutive calls.

    Each round runs every contender in turn, a block of calls each (the first call of a block is
    a warm-up and not timed): alternating rounds spread a noisy neighbour over all of them, while
    blocks keep one runtime's idle thread pool (onnxruntime and OpenMP workers spin for a while
    after a run) from stealing the cores of the next contender's timed calls.
    """
    times: dict[str, list[float]] = {name: [] for name in runners}
    per_round = max(1, reps // rounds)
    for _ in range(rounds):
        for name, run in runners.items():
            run()
            for _ in range(per_round):
                t0 = time.perf_counter()
                run()
                times[name].append((time.perf_counter() - t0) * 1e3)
    return {name: statistics.median(values) for name, values in times.items()}


def measure(name: str, *, threads: int, reps: int, small: bool) -> dict[str, Any]:
    source = zoo.build(name, **(SMALL[name] if small else {}))
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
        profile = ours_unfused.profile(feeds, reps=3)
        total_ms = sum(r["min_ms"] for r in profile)
        anchor_ms = sum(r["min_ms"] for r in profile if r["template"] == "anchor")
        anchor_share = anchor_ms / total_ms if total_ms else 0.0
        medians = block_medians(
            {
                "unfused": lambda: ours_unfused(feeds),
                "fused": lambda: ours_fused(feeds),
                "ort_disable_all": lambda: disable_all.run(None, feeds),
                "ort_enable_all": lambda: enable_all.run(None, feeds),
            },
            reps,
        )
    return {
        "model": name,
        "threads": threads,
        "kernels_unfused": ours_unfused.stats["kernels"],
        "kernels_fused": ours_fused.stats["kernels"],
        "host_ops_fused": len(ours_fused.stats["host_ops"]),
        **{f"{k}_ms": round(v, 3) for k, v in medians.items()},
        "fused_vs_unfused": round(medians["fused"] / medians["unfused"], 3),
        "fused_vs_ort_enable_all": round(medians["fused"] / medians["ort_enable_all"], 3),
        "unfused_anchor_share": round(anchor_share, 3),
        "arena_unfused_bytes": ours_unfused.stats["arena_bytes"],
        "arena_fused_bytes": ours_fused.stats["arena_bytes"],
        "cold_compile_s": round(cold, 2),
        "warm_load_s": round(warm, 3),
        "max_abs_err_vs_ort": max_abs,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--small", action="store_true", help="small variants (a smoke run of the script)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = []
    header = (
        f"{'model':<13} {'unfused':>9} {'fused':>9} {'ort-dis':>9} {'ort-all':>9} {'f/unf':>6} {'f/ort':>6} "
        f"{'anchor%':>7} {'arena unf→fused MB':>19} {'cold s':>7} {'warm s':>7}"
    )
    if not args.json:
        print(header)
    for name in args.models.split(","):
        row = measure(name, threads=args.threads, reps=args.reps, small=args.small)
        rows.append(row)
        if not args.json:
            arena = f"{row['arena_unfused_bytes'] / 1e6:.1f}→{row['arena_fused_bytes'] / 1e6:.1f}"
            print(
                f"{name:<13} {row['unfused_ms']:>9.2f} {row['fused_ms']:>9.2f} "
                f"{row['ort_disable_all_ms']:>9.2f} {row['ort_enable_all_ms']:>9.2f} "
                f"{row['fused_vs_unfused']:>6.2f} "
                f"{row['fused_vs_ort_enable_all']:>6.2f} {100 * row['unfused_anchor_share']:>7.1f} "
                f"{arena:>19} {row['cold_compile_s']:>7.2f} "
                f"{row['warm_load_s']:>7.3f}",
                flush=True,
            )
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
