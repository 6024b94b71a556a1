"""The attention kernel on the CPU against the unfused attention path, in one process.

For each model: the fused model planned with the attention pattern (one kernel per attention
block: lower/attention.py) and without it (QK^T and P·V as BLAS anchor kernels around a row
softmax kernel), both compiled for this host and timed in alternating rounds of consecutive calls
(runtime_speed.block_medians), so a noisy neighbour slows both alike. Also printed: each
variant's kernel count and the largest difference between the two outputs.

    python benchmarks/attention_speed.py [--models bert_base,gpt2,vit_b16] [--reps 7] [--threads 2]
        [--small]

The planner forms attention for the `cpu` profile by default (plan/patterns.py `Attention`, which
records what this script measured); the first variant still sets GRAPH_AUTOFUSION_ATTENTION=on
so that it measures the kernel whatever the environment says.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

import graph_autofusion as gaf
from graph_autofusion import FusionConfig, zoo
from graph_autofusion.backend.cpu.cache import KernelCache
from graph_autofusion.backend.cpu.runtime import compile_model
from graph_autofusion.hardware import describe_host
from graph_autofusion.plan.patterns import Attention

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runtime_speed import SMALL, block_medians


def _members(fused: gaf.FusedGraph) -> dict[str, set[str]]:
    members = {}
    for node in fused.model.graph.node:
        try:
            members[node.name] = set(json.loads(node.doc_string).get("members", []))
        except ValueError:
            members[node.name] = {node.name}
    return members


def _part_ms(variants, core: set[str], feeds, rounds: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Per variant (name -> (compiled, fused)): milliseconds of the kernels computing any of
    `core`, each kernel at its fastest over `rounds` alternating rounds of 3 profiled runs (on a
    shared machine the variants then meet the same neighbours; a single profile of one, then
    the other, drifted by 30%)."""
    best: dict[str, dict[int, float]] = {name: {} for name in variants}
    for _ in range(max(1, rounds)):
        for name, (compiled, fused) in variants.items():
            members = _members(fused)
            rows = compiled.profile(feeds, reps=3)
            for k, r in enumerate(rows):
                if members.get(r["node"], set()) & core:
                    best[name][k] = min(best[name].get(k, float("inf")), r["min_ms"])
    return {name: sum(ms.values()) for name, ms in best.items()}


def measure(name: str, *, reps: int, threads: int, small: bool) -> dict[str, object]:
    source = zoo.build(name, **(SMALL[name] if small else {}))
    feeds = zoo.example_inputs(source)
    saved = os.environ.get(Attention.ENV)
    os.environ[Attention.ENV] = "on"
    try:
        with_attention = gaf.fuse(source)
    finally:
        if saved is None:
            del os.environ[Attention.ENV]
        else:
            os.environ[Attention.ENV] = saved
    without = gaf.fuse(source, FusionConfig(disabled_patterns=["attention"]))
    with tempfile.TemporaryDirectory(prefix="autofusion-attention-") as tmp:
        cache = KernelCache(tmp)
        on = compile_model(with_attention.model, cache=cache, threads=threads)
        off = compile_model(without.model, cache=cache, threads=threads)
        a, b = on(feeds), off(feeds)
        diff = max(float(np.max(np.abs(x - y))) for x, y in zip(a.values(), b.values(), strict=True))
        medians = block_medians({"on": lambda: on(feeds), "off": lambda: off(feeds)}, reps)
        # the kernels holding attention's MatMuls and Softmax in each plan, summed over a profile
        g = with_attention.plan.graph
        ops = {"MatMul", "Softmax"}
        core = {g.nodes[i].name for grp in with_attention.plan.groups if grp.template == "attention"
                for i in grp.members if g.nodes[i].op_type in ops}  # fmt: skip
        parts = _part_ms({"on": (on, with_attention), "off": (off, without)}, core, feeds, reps)
        part_on, part_off = parts["on"], parts["off"]
    return {
        "model": name,
        "kernels_on": on.stats["kernels"],
        "kernels_off": off.stats["kernels"],
        "host_ops_on": len(on.stats["host_ops"]),
        "on_ms": round(medians["on"], 2),
        "off_ms": round(medians["off"], 2),
        "on_vs_off": round(medians["on"] / medians["off"], 3),
        "attention_ms": round(part_on, 2),
        "unfused_attention_ms": round(part_off, 2),
        "max_abs_diff": diff,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="bert_base,gpt2,vit_b16")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--small", action="store_true")
    args = parser.parse_args()
    print(describe_host())
    print(f"{args.threads} threads, median of {args.reps} runs in alternating rounds")
    columns = (
        f"{'k.on':>6}{'k.off':>6}{'on ms':>10}{'off ms':>10}{'on/off':>8}{'attn on':>9}{'attn off':>9}"
        f"{'diff':>10}"
    )
    print(f"{'model':<12}{columns}")
    for name in args.models.split(","):
        r = measure(name, reps=args.reps, threads=args.threads, small=args.small)
        print(
            f"{name:<12}{r['kernels_on']:>6}{r['kernels_off']:>6}{r['on_ms']:>10}{r['off_ms']:>10}"
            f"{r['on_vs_off']:>8}{r['attention_ms']:>9}{r['unfused_attention_ms']:>9}{r['max_abs_diff']:>10.1e}",
            flush=True,
        )


if __name__ == "__main__":
    main()
