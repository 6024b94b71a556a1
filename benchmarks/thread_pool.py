"""The kernels' thread pool against libgomp's teams, side by side, with onnxruntime as the yardstick.

Which runs a compiled model's parallel loops is fixed per process (`AUTOFUSION_THREAD_POOL`: each
loaded unit is attached once), so each measurement is a child process: for every model, `--pairs`
pairs of children, one per mode, in alternating order, each timing our fused model and
onnxruntime ENABLE_ALL in alternating blocks (runtime_speed.block_medians). The table gives, per
mode, the median over the children of our time, onnxruntime's and their ratio (f/ort), and the
worst child's ratio: these hosts drift between quiet and slow stretches, and the ratio to a peer
measured in the same child is what survives the drift.

`--busy-neighbour` runs a `nice 19` busy loop pinned to the last CPU while the children run: the
shape of a shared host, where a worker thread's core is sometimes taken, and where a team that
waits for every thread pays for it in every kernel.

`--pace-ms P` times each call after a pause of P ms instead of back to back (`block_times`' pace): a
service's requests, where the pool's workers have gone to sleep before every run and each run
starts by waking them. Back-to-back blocks never see that start: on a 2-vCPU AMD EPYC Zen 3 host,
before the workers slept away from their caller's CPU (pool.c: afp_sleep_away), the wake put the
worker on its caller's vCPU and MobileNetV2 paced at 5 ms ran 1.6-1.8x onnxruntime where its
back-to-back runs read 1.2x; after, 1.13-1.14x paced.

Run: `.venv/bin/python benchmarks/thread_pool.py [--models resnet50,mobilenet_v2,mlp] [--pairs 3]
[--reps 20] [--threads 2] [--busy-neighbour] [--pace-ms 5] [--small]`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

MODES = ("pool", "openmp")
HERE = Path(__file__).resolve().parent


def child(name: str, threads: int, reps: int, small: bool, pace_ms: float) -> dict[str, float | str]:
    """One measurement in this process: our fused model and onnxruntime, alternating blocks (of
    calls `pace_ms` apart, if it is set)."""
    import onnxruntime as ort

    import graph_autofusion as gaf
    from graph_autofusion import zoo
    from graph_autofusion.backend.cpu.runtime import compile_model

    sys.path.insert(0, str(HERE))
    from runtime_speed import SMALL, block_medians, ort_session

    source = zoo.build(name, **(SMALL[name] if small else {}))
    feeds = zoo.example_inputs(source)
    fused = gaf.fuse(source)
    ours = compile_model(fused.model, threads=threads)
    peer = ort_session(fused.canonical_reference, ort.GraphOptimizationLevel.ORT_ENABLE_ALL, threads)
    runners = {"fused": lambda: ours(feeds), "ort": lambda: peer.run(None, feeds)}
    medians = block_medians(runners, reps, pace=pace_ms / 1e3)
    return {**medians, "thread_pool": ours.stats["thread_pool"]}


@contextmanager
def busy_neighbour(enabled: bool) -> Iterator[None]:
    """A `nice 19` busy loop pinned to the last CPU, for the block's duration."""
    if not enabled:
        yield
        return
    cpu = max(os.sched_getaffinity(0))
    hog = subprocess.Popen(
        ["nice", "-n", "19", "taskset", "-c", str(cpu), sys.executable, "-c", "while True: pass"]
    )
    try:
        yield
    finally:
        hog.kill()
        hog.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="resnet50,mobilenet_v2,mlp")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--busy-neighbour", action="store_true")
    parser.add_argument("--pace-ms", type=float, default=0.0, help="a pause before every timed call")
    parser.add_argument("--small", action="store_true", help="small variants (a smoke run of the script)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.threads, args.reps, args.small, args.pace_ms)))
        return

    from graph_autofusion.hardware import describe_host

    print(describe_host())
    print(
        f"{args.threads} threads, {args.pairs} pairs of child processes per model, median of at least "
        f"{args.reps} runs each"
        + (f", each call {args.pace_ms:g} ms after the last" if args.pace_ms > 0 else ", back to back")
        + (", a nice-19 busy loop on the last CPU" if args.busy_neighbour else "")
    )
    print(f"{'model':<13} {'mode':<7} {'fused ms':>9} {'ort ms':>9} {'f/ort':>6} {'worst f/ort':>11}")
    with busy_neighbour(args.busy_neighbour):
        for name in args.models.split(","):
            rows: dict[str, list[dict]] = {mode: [] for mode in MODES}
            for pair in range(args.pairs):
                for mode in MODES if pair % 2 == 0 else MODES[::-1]:
                    command = [sys.executable, __file__, "--child", name, "--threads", str(args.threads)]
                    command += ["--reps", str(args.reps), "--pace-ms", str(args.pace_ms)]
                    command += ["--small"] if args.small else []
                    env = {**os.environ, "AUTOFUSION_THREAD_POOL": mode}
                    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
                    row = json.loads(out.stdout.strip().splitlines()[-1])
                    if row["thread_pool"] != mode:
                        raise SystemExit(f"a child asked for {mode} ran on {row['thread_pool']}")
                    rows[mode].append(row)
            for mode in MODES:
                ratios = [r["fused"] / r["ort"] for r in rows[mode]]
                fused = statistics.median(r["fused"] for r in rows[mode])
                peer = statistics.median(r["ort"] for r in rows[mode])
                print(
                    f"{name:<13} {mode:<7} {fused:>9.3f} {peer:>9.3f} "
                    f"{statistics.median(ratios):>6.2f} {max(ratios):>11.2f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
