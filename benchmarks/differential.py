"""Differential campaign: N random graphs fused, compiled and run, judged against onnxruntime.

Prints the host (CPU model, ISA the kernels target), the counts per outcome (pass, host, refused,
disputed, wrong, crash), a table per op (graphs containing the op, by outcome), and one line per
wrong/crash/disputed graph with its seed and the path of its minimal repro (`diff_<seed>.onnx` +
`.npz` inputs). `graph_autofusion.testing.random_graphs.generate(seed)` rebuilds any graph.

Run: `.venv/bin/python benchmarks/differential.py [--count 200] [--seed 0] [--threads 1]
[--jobs 2] [--repro-dir differential-repros] [--cache DIR] [--include-known-bugs] [--quiet]`

Exits 1 when any graph is wrong or crashed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from graph_autofusion.backend.cpu.cache import KernelCache
from graph_autofusion.testing.differential import (
    CRASH,
    WRONG,
    Verdict,
    counts,
    format_summary,
    host_header,
    run_campaign,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--count", type=int, default=200, help="graphs to draw")
    parser.add_argument("--seed", type=int, default=0, help="first seed (graphs use seed..seed+count-1)")
    parser.add_argument("--threads", type=int, default=1, help="threads of the compiled kernels")
    parser.add_argument("--jobs", type=int, default=None, help="parallel compiler runs")
    parser.add_argument("--repro-dir", default="differential-repros", help="where minimal repros go")
    parser.add_argument("--cache", help="kernel cache directory (default: a temporary one)")
    parser.add_argument(
        "--include-known-bugs", action="store_true", help="also draw configurations with known open bugs"
    )
    parser.add_argument("--quiet", action="store_true", help="no per-graph progress line")
    args = parser.parse_args(argv)

    print(host_header())
    print(f"graphs: seeds {args.seed}..{args.seed + args.count - 1}, threads={args.threads}")
    started = time.perf_counter()

    def progress(v: Verdict) -> None:
        if not args.quiet and v.status in (WRONG, CRASH):
            print(v.line(), flush=True)

    with tempfile.TemporaryDirectory(prefix="af-differential-") as tmp:
        cache = KernelCache(Path(args.cache or tmp))
        verdicts = run_campaign(
            range(args.seed, args.seed + args.count),
            cache,
            jobs=args.jobs,
            threads=args.threads,
            repro_dir=Path(args.repro_dir),
            avoid_known_bugs=not args.include_known_bugs,
            progress=progress,
        )
    elapsed = time.perf_counter() - started
    print(format_summary(verdicts))
    print(f"{len(verdicts)} graphs in {elapsed:.1f} s ({elapsed / max(1, len(verdicts)):.2f} s per graph)")
    c = counts(verdicts)
    return 1 if c[WRONG] or c[CRASH] else 0


if __name__ == "__main__":
    sys.exit(main())
