"""Fusion quality on every zoo model, measured side by side in one run.

For each model (full size, torchscript-style export): ONNX nodes, kernels before and after fusion,
the lower bound of one-anchor kernels (one kernel per conv/matmul/gemm/pool/reduction; attention and
chains of two contractions, GEMM or conv, share one kernel and go below it), onnxruntime's node count after
its own fusions at ORT_ENABLE_EXTENDED and ORT_ENABLE_ALL, and our planning time (median of 3).

    python benchmarks/fusion_quality.py [--style dynamo] [--models resnet50,bert_base]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import onnx
import onnxruntime as ort

import graph_autofusion as gaf
from graph_autofusion.hardware import describe_host
from graph_autofusion.ir import Graph
from graph_autofusion.ops import OpKind

MODELS = ["resnet50", "mobilenet_v2", "bert_base", "gpt2", "vit_b16", "mlp"]


def lower_bound(graph: Graph) -> int:
    return sum(1 for n in graph.nodes if n.kind in (OpKind.ANCHOR, OpKind.REDUCE))


def ort_nodes(model: onnx.ModelProto, level: ort.GraphOptimizationLevel) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "opt.onnx")
        opts = ort.SessionOptions()
        opts.graph_optimization_level = level
        opts.optimized_model_filepath = out
        opts.log_severity_level = 3
        ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        return len(onnx.load(out, load_external_data=False).graph.node)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--style", default="torchscript", choices=["torchscript", "dynamo"])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--cost-model", default="memory_bandwidth")
    args = parser.parse_args()
    header = (
        f"{'model':<14}{'nodes':>7}{'canon':>7}{'k.before':>9}{'k.after':>8}{'lower':>7}"
        f"{'ort.ext':>8}{'ort.all':>8}{'plan s':>8}{'fuse s':>8}"
    )
    print(describe_host())
    print(f"style={args.style} cost_model={args.cost_model}")
    print(header)
    print("-" * len(header))
    for name in args.models.split(","):
        model = gaf.zoo.build(name, style=args.style)
        config = gaf.FusionConfig(cost_model=args.cost_model)
        runs = []
        for _ in range(3):
            t0 = time.perf_counter()
            fused = gaf.fuse(model, config)
            runs.append(time.perf_counter() - t0)
        report = fused.report()
        bound = lower_bound(fused.plan.graph)
        ext = ort_nodes(model, ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED)
        full = ort_nodes(model, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
        print(
            f"{name:<14}{report['operators']['original']:>7}{report['operators']['canonical']:>7}"
            f"{report['kernels']['before']:>9}{report['kernels']['after']:>8}{bound:>7}{ext:>8}{full:>8}"
            f"{report['timings_ms']['plan'] / 1e3:>8.2f}{statistics.median(runs):>8.2f}"
        )


if __name__ == "__main__":
    main()
