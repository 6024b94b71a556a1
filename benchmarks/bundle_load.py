"""Bundle load: time and memory of `graph_autofusion.load` in a fresh process, per zoo model.

Each model is built at full size, fused, run once and saved as a bundle (once per `--out`
directory: an existing bundle is reused, so two checkouts can be compared on their own bundles).
Then `--reps` fresh processes each load it and run it twice, and print: the load's wall and CPU
time (CPU time is what a busy shared host cannot inflate by preempting the process), the runtime's
own share (`stats["load_seconds"]`: packing happens there when the bundle holds no packed weights),
the first and second run, the raw and packed weight bytes the runtime holds, and the process's
resident memory after the runs and at its peak (`getrusage`; packed weights mapped from the bundle
count as resident file pages once touched).

Run: `.venv/bin/python benchmarks/bundle_load.py [--models gpt2,resnet50,bert_base] [--reps 3]
[--out /tmp/bundles] [--json]`; the header names the host. The children run with `python -P`, so
the engine is the one PYTHONPATH names even when started from a checkout (to compare two).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, resource, sys, time
t0, c0 = time.perf_counter(), time.process_time()
import numpy as np
import graph_autofusion as gaf
t1, c1 = time.perf_counter(), time.process_time()
model = gaf.load(sys.argv[1])
t2, c2 = time.perf_counter(), time.process_time()
rng = np.random.default_rng(0)  # ids 0: `model.model` would read the weights back to bound them
feeds = {}
for t in model.plan.inputs:
    ints = t.dtype.kind in "iub"
    feeds[t.name] = np.zeros(t.shape, t.dtype) if ints else rng.standard_normal(t.shape).astype(t.dtype)
runs = []
for _ in range(2):
    start = time.perf_counter()
    model(feeds)
    runs.append(time.perf_counter() - start)
rss = [int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS")][0] * 1024
s = model.stats
print(json.dumps({
    "load_s": t2 - t1, "load_cpu_s": c2 - c1, "runtime_load_s": s["load_seconds"],
    "first_run_s": runs[0], "second_run_s": runs[1],
    "weights_bytes": s["weights_bytes"], "packed_weights_bytes": s["packed_weights_bytes"],
    "packed_weights_source": s.get("packed_weights_source", "packed at load"),
    "rss_after_bytes": rss, "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
}))
"""


MAKER = r"""
import sys
import graph_autofusion as gaf
fused = gaf.fuse(gaf.zoo.build(sys.argv[1]))
fused(gaf.zoo.example_inputs(fused.canonical))
fused.save_bundle(sys.argv[2])
"""


def make_bundle(name: str, out: Path) -> Path:
    """The zoo model `name` at full size, fused and saved as a bundle under `out` (reused). In a
    child process: Linux hands a process's peak RSS on across execve, so the loaders, started
    from this one, would otherwise report the fusion's peak as their own."""
    path = out / f"{name}.bundle"
    if not (path / "manifest.json").exists():
        subprocess.run([sys.executable, "-P", "-c", MAKER, name, str(path)], check=True, timeout=1800)
    return path


def load_once(path: Path) -> dict[str, float | int | str]:
    """One load and two runs of the bundle at `path` in a fresh process."""
    command = [sys.executable, "-P", "-c", CHILD, str(path)]
    done = subprocess.run(command, capture_output=True, text=True, check=True, timeout=600)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt2,resnet50,bert_base")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("/tmp/autofusion-bundle-load"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from graph_autofusion.hardware import describe_host

    args.out.mkdir(parents=True, exist_ok=True)
    paths = {name: make_bundle(name, args.out) for name in args.models.split(",")}
    rows = {name: [] for name in paths}
    for _ in range(args.reps):  # interleaved: a shared host's load drifts
        for name, path in paths.items():
            rows[name].append(load_once(path))
    if args.json:
        print(json.dumps({"host": describe_host(), "rows": rows}, indent=2))
        return
    print(describe_host())
    mib = 2**20
    for name, reps in rows.items():
        med = {k: statistics.median(r[k] for r in reps) for k in reps[0] if k != "packed_weights_source"}
        print(
            f"{name:10} load {med['load_s']:.2f} s (cpu {med['load_cpu_s']:.2f}, runtime "
            f"{med['runtime_load_s']:.3f}), runs {med['first_run_s']:.3f}/{med['second_run_s']:.3f} s, "
            f"weights {med['weights_bytes'] / mib:.1f} + packed {med['packed_weights_bytes'] / mib:.1f} MiB "
            f"({reps[0]['packed_weights_source']}), rss after {med['rss_after_bytes'] / mib:.0f} MiB, "
            f"peak {max(r['peak_rss_bytes'] for r in reps) / mib:.0f} MiB"
        )


if __name__ == "__main__":
    main()
