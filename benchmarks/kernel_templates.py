"""Time per kernel template (pointwise, reduction, pool, single, anchor) for zoo models.

For each model, the sum over its kernels of each kernel's fastest run (`CompiledModel.profile`,
`min_ms`), grouped by template, fused or unfused. The fastest run is the kernel's own cost on a
shared machine; compare two versions of the engine by running this script from each checkout in
alternation on the same host.

Run: `.venv/bin/python benchmarks/kernel_templates.py [--models bert_base,resnet50] [--unfused]
[--reps 7] [--threads 2]`
"""

from __future__ import annotations

import argparse
import collections

import graph_autofusion as gaf
from graph_autofusion import FusionConfig, zoo
from graph_autofusion.backend.cpu.runtime import compile_model
from graph_autofusion.hardware import describe_host


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50,mobilenet_v2,bert_base,gpt2,vit_b16")
    parser.add_argument("--unfused", action="store_true", help="every op its own kernel")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    print(f"{describe_host()}, {args.threads} threads")
    templates = ("pointwise", "reduction", "pool", "single", "anchor", "anchor_chain", "host")
    print(f"{'model':<14}" + "".join(f"{t:>14}" for t in templates) + "   (ms, sum of per-kernel minima)")
    config = FusionConfig(max_fusion_size=0) if args.unfused else None
    for name in args.models.split(","):
        fused = gaf.fuse(zoo.build(name), config=config)
        compiled = compile_model(fused.model, threads=args.threads)
        by = collections.Counter[str]()
        for row in compiled.profile(zoo.example_inputs(fused.canonical), reps=args.reps):
            by[row.get("template", "host")] += row["min_ms"]
        print(f"{name:<14}" + "".join(f"{by[t]:>14.3f}" if t in by else f"{'-':>14}" for t in templates))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
