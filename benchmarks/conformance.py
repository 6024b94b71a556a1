"""The whole ONNX node suite through `graph_autofusion.fuse` and the compiled runtime.

    python benchmarks/conformance.py                    # every case, a table per op
    python benchmarks/conformance.py Softmax Mod -v     # some ops (or case names), every non-pass listed
    python benchmarks/conformance.py --repeat 2         # each case twice, arena poisoned differently
    python benchmarks/conformance.py --sanitize address # kernels under ASan + UBSan (re-executes
                                                        # itself with the ASan runtime preloaded)

Every case onnx ships (`onnx.backend.test.case.node`: all ops, all dtypes, `_expanded` bodies)
is fused as a user would fuse it, compiled and run; its outputs are compared with the expected
ones at the case's own tolerance. Statuses: pass, host (right, but a node ran on the host path),
wrong (must be 0), refused (a stable error code), error. The header names the host CPU and the
ISA the kernels were built for, since both change which code runs. Exit status 1 if any case is
wrong.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

from graph_autofusion.backend.cpu import sanitize
from graph_autofusion.backend.cpu.cache import KernelCache
from graph_autofusion.backend.cpu.compiler import compiler_identity
from graph_autofusion.backend.cpu.suite import (
    ERROR,
    HOST,
    PASS,
    REFUSED,
    WRONG,
    format_suite,
    run_suite,
    suite_cases,
)
from graph_autofusion.hardware import describe_host


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("names", nargs="*", help="op types or case names (default: every case)")
    parser.add_argument("--cache", help="kernel cache directory (default: a temporary one)")
    parser.add_argument("--jobs", type=int, default=None, help="parallel compiler runs")
    parser.add_argument("--repeat", type=int, default=1, help="runs per case, arena re-poisoned each time")
    parser.add_argument(
        "--sanitize",
        choices=("address", "undefined"),
        help="the sanitizer debug build (the first report aborts the run, naming the kernel)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="list every case that did not pass")
    parser.add_argument("--no-per-op", action="store_true", help="print the overall counts only")
    args = parser.parse_args(argv)
    if args.sanitize:
        mode = sanitize.sanitize_mode(args.sanitize)
        if sanitize.sanitize_mode() != mode or (mode == sanitize.ADDRESS and not sanitize.asan_loaded()):
            env = sanitize.subprocess_env(mode=mode)
            os.execve(sys.executable, [sys.executable, *sys.argv], env)

    print(describe_host())
    mode = sanitize.sanitize_mode()
    print(f"compiler: {compiler_identity().version}" + (f", -fsanitize={mode}" if mode else ""))
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="af-suite-") as tmp:
        cache = KernelCache(args.cache or tmp)
        cases = suite_cases(args.names or None)
        outcomes = run_suite(cases, cache, repeat=args.repeat, jobs=args.jobs)
    print(format_suite(outcomes, per_op=not args.no_per_op))
    if args.verbose:
        for o in outcomes:
            if o.status in (HOST, REFUSED, ERROR):
                print(f"{o.status:<8}{o.case} [{o.code}]: {o.detail}")
    counts = {s: sum(1 for o in outcomes if o.status == s) for s in (PASS, HOST, WRONG, REFUSED, ERROR)}
    print(
        f"\n{counts[PASS]} of {len(outcomes)} cases pass as generated kernels "
        f"({counts[HOST]} more right through host ops, {counts[WRONG]} wrong, {counts[REFUSED]} refused, "
        f"{counts[ERROR]} errors) in {time.perf_counter() - started:.0f} s"
    )
    return 1 if counts[WRONG] else 0


if __name__ == "__main__":
    sys.exit(main())
