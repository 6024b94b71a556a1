"""Anchor kernel speed: generated Conv / MatMul kernels (with a bias + ReLU epilogue) against
onnxruntime (ORT_ENABLE_ALL, which fuses Conv+Relu and MatMul+Add itself) on the same model.

Shapes: the conv shape classes of ResNet-50 (stem 7x7/2, 1x1 reduce/expand, 3x3 at each stage,
3x3 stride 2, 1x1 stride-2 downsample), two MobileNetV2 depthwise convs, and the GEMMs of a
BERT-base layer at sequence length 128 (as MatMul + Add + Relu), plus the FFN's first GEMM with
its real epilogue, bias + exact GELU (Div, Erf, Add, Mul, Mul; onnxruntime fuses it into its own
BiasGelu); `transformer`: the projections of BERT-base / GPT-2 (128 tokens) and ViT-B/16 (197)
with the epilogues those models have (bias; bias + GELU after the FFN's first GEMM), where the
fused QKV projection is N = 2304. Batch 1.

Our side is the one-node model fused and compiled by the runtime (`compile_model`, `threads` wide)
and timed through `CompiledModel.run`, as a user runs it: the copy of the input into the arena and
of the output out are included, as they are in onnxruntime's `run`. For each shape and thread
count: the median latency of ours, of onnxruntime, and their ratio (ours / ort; below 1.0 means
we are faster), the same for the fastest run (on a shared, busy machine the minimum shows the
kernel, the median shows the neighbours too), GFLOP/s, `peak%` (ours against the FMA peak of as
many cores: `contraction.shim.peak_flops`, register-only FMA chains on one core timed by process
CPU time, times the threads), the max abs difference of the outputs, the method the generator
chose, and, where the shape is one plain GEMM (MatMul, 1x1 stride-1 conv), `blas/ours`: the speed
of one OpenBLAS sgemm call on the same contraction with as many BLAS threads and no epilogue,
relative to ours (1.0 = ours is as fast as the bare BLAS; the issue's target for a GEMM anchor is
blas/ours >= 0.8). The two sides run in alternating blocks of runs (see `_time_pair`), so a noisy
neighbour hurts both alike.

Run: `.venv/bin/python benchmarks/anchors.py [--threads 1,2] [--reps 15]
[--only resnet|bert|dw|transformer]
[--omp-dynamic] [--no-ort-spin] [--json]` (under a minute on 2 cores).

On a shared machine, 2-thread medians of any fork/join kernel suffer when the second thread is
not scheduled in time: the team's closing barrier waits for it (stalls in multiples of the 4 ms
scheduler tick were measured at load average 2.5 on 2 cores), while onnxruntime's caller thread
simply does the work itself. Spinning idle workers made it worse (they hold the core the late
thread needs), so the backend lets libgomp's workers spin only briefly before they sleep
(`GOMP_SPINCOUNT`, threads.py, which has the figures). `--omp-dynamic` lets libgomp size the
team by the load average instead (dw 3x3 144x56x56 at 2 threads: median 12 ms -> 0.26 ms), but
on 2 cores that average includes this process, so it nearly always means one thread, even on an
idle machine: a diagnostic, not a setting for the runtime.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import graph_autofusion as gaf
from graph_autofusion.backend.cpu import blas
from graph_autofusion.backend.cpu.cache import KernelCache
from graph_autofusion.backend.cpu.contraction.shim import build_library, peak_flops
from graph_autofusion.backend.cpu.runtime import CompiledModel, compile_model
from graph_autofusion.backend.cpu.threads import set_omp_threads
from graph_autofusion.hardware import describe_host


@dataclass(frozen=True)
class Shape:
    name: str
    family: str  # resnet | dw | bert | transformer
    kind: str  # conv | matmul
    dims: tuple[int, ...]  # conv: (cin, cout, hw, k, stride, group); matmul: (m, k, n)
    # matmul only: "relu" (bias + ReLU), "bias" (bias only) or "gelu" (bias + exact GELU, with erf)
    epilogue: str = "relu"


SHAPES = [
    Shape("stem 7x7/2 3->64 224", "resnet", "conv", (3, 64, 224, 7, 2, 1)),
    Shape("1x1 64->64 56", "resnet", "conv", (64, 64, 56, 1, 1, 1)),
    Shape("1x1 256->64 56", "resnet", "conv", (256, 64, 56, 1, 1, 1)),
    Shape("3x3 64->64 56", "resnet", "conv", (64, 64, 56, 3, 1, 1)),
    Shape("1x1 64->256 56", "resnet", "conv", (64, 256, 56, 1, 1, 1)),
    Shape("3x3/2 128->128 56", "resnet", "conv", (128, 128, 56, 3, 2, 1)),
    Shape("3x3 256->256 14", "resnet", "conv", (256, 256, 14, 3, 1, 1)),
    Shape("1x1/2 1024->2048 14", "resnet", "conv", (1024, 2048, 14, 1, 2, 1)),
    Shape("3x3 512->512 7", "resnet", "conv", (512, 512, 7, 3, 1, 1)),
    Shape("1x1 2048->512 7", "resnet", "conv", (2048, 512, 7, 1, 1, 1)),
    Shape("dw 3x3 144 56", "dw", "conv", (144, 144, 56, 3, 1, 144)),
    Shape("dw 3x3/2 96 112", "dw", "conv", (96, 96, 112, 3, 2, 96)),
    Shape("bert 128x768x768", "bert", "matmul", (128, 768, 768)),
    Shape("bert 128x768x3072", "bert", "matmul", (128, 768, 3072)),
    Shape("bert 128x768x3072 gelu", "bert", "matmul", (128, 768, 3072), "gelu"),
    Shape("bert 128x3072x768", "bert", "matmul", (128, 3072, 768)),
    *(
        Shape(
            f"{net} {m}x{k}x{n}" + (" gelu" if epi == "gelu" else ""), "transformer", "matmul", (m, k, n), epi
        )
        for net, m in (("bert/gpt2", 128), ("vit", 197))
        for k, n, epi in ((768, 768, "bias"), (768, 2304, "bias"), (768, 3072, "gelu"), (3072, 768, "bias"))
    ),
]


def _model(shape: Shape, rng: np.random.Generator) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    f32 = TensorProto.FLOAT
    if shape.kind == "conv":
        cin, cout, hw, k, stride, group = shape.dims
        x = rng.standard_normal((1, cin, hw, hw)).astype(np.float32)
        w = (rng.standard_normal((cout, cin // group, k, k)) / np.sqrt(cin // group * k * k)).astype(
            np.float32
        )
        b = rng.standard_normal(cout).astype(np.float32)
        nodes = [
            helper.make_node(
                "Conv", ["x", "w", "b"], ["y"], pads=[k // 2] * 4, strides=[stride] * 2, group=group
            ),
            helper.make_node("Relu", ["y"], ["o"]),
        ]
        inits = {"w": w, "b": b}
    else:
        m, kk, n = shape.dims
        x = rng.standard_normal((1, m, kk)).astype(np.float32)
        inits = {
            "w": (rng.standard_normal((kk, n)) / np.sqrt(kk)).astype(np.float32),
            "b": rng.standard_normal(n).astype(np.float32),
        }
        last = "o" if shape.epilogue == "bias" else "z"
        nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Add", ["y", "b"], [last])]
        if shape.epilogue == "gelu":  # BERT's FFN: z * 0.5 * (1 + erf(z / sqrt(2))), as exporters write it
            inits.update(
                sqrt2=np.array(np.sqrt(2.0), np.float32),
                one=np.array(1.0, np.float32),
                half=np.array(0.5, np.float32),
            )
            nodes += [
                helper.make_node("Div", ["z", "sqrt2"], ["g_div"]),
                helper.make_node("Erf", ["g_div"], ["g_erf"]),
                helper.make_node("Add", ["g_erf", "one"], ["g_add"]),
                helper.make_node("Mul", ["z", "g_add"], ["g_mul"]),
                helper.make_node("Mul", ["g_mul", "half"], ["o"]),
            ]
        elif shape.epilogue == "relu":
            nodes.append(helper.make_node("Relu", ["z"], ["o"]))
    graph = helper.make_graph(
        nodes,
        "bench",
        [helper.make_tensor_value_info("x", f32, list(x.shape))],
        [helper.make_tensor_value_info("o", f32, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model, strict_mode=True), {"x": x, **inits}


def _time_pair(
    ours: Callable[[], object], theirs: Callable[[], object], reps: int
) -> tuple[list[float], list[float]]:
    """Timings (seconds) of both sides in alternating blocks of runs, after warm-up runs.

    Blocks, not single interleaved runs: onnxruntime's pool spins for a while after each run and
    libgomp's does too, so a run right after the other side's finds both cores taken by spinning
    threads (measured: 2-thread medians 20-40x worse than when each side runs in its own block).
    A short pause between blocks lets the spinners go to sleep.
    """
    a: list[float] = []
    b: list[float] = []
    rounds = 3
    per = max(1, reps // rounds)
    for _ in range(rounds):
        for fn, out in ((ours, a), (theirs, b)):
            for _ in range(2):
                fn()
            for _ in range(per):
                t0 = time.perf_counter()
                fn()
                out.append(time.perf_counter() - t0)
            time.sleep(0.05)
    return a, b


@dataclass
class Row:
    shape: str
    method: str
    threads: int
    ours_ms: float  # median
    ort_ms: float  # median
    ratio: float  # of the medians
    ours_min_ms: float  # the least disturbed run, for a busy machine
    ort_min_ms: float
    gflops: float
    peak_pct: float  # gflops against the host's FMA peak on `threads` threads, in percent
    max_abs_err: float
    blas_ms: float | None  # median of one plain OpenBLAS sgemm, same GEMM, `threads` BLAS threads


def _plain_gemm(shape: Shape) -> tuple[int, int, int] | None:
    """(M, N, K) when the shape is one GEMM without a gather (matmul, 1x1 stride-1 conv)."""
    if shape.kind == "matmul":
        m, k, n = shape.dims
        return m, n, k
    cin, cout, hw, k, stride, group = shape.dims
    if k == 1 and stride == 1 and group == 1:
        return cout, hw * hw, cin
    return None


def _blas_time(mnk: tuple[int, int, int], threads: int, reps: int) -> float:
    """Median seconds of one row-major sgemm call with `threads` OpenBLAS threads, no epilogue:
    the BLAS's own speed on the same contraction, for judging the tiling's overhead."""
    m, n, k = mnk
    lib = blas.load_blas()
    sgemm = lib.scipy_cblas_sgemm
    fp = ctypes.c_void_p
    sgemm.argtypes = [ctypes.c_int] * 6 + [ctypes.c_float, fp, ctypes.c_int, fp, ctypes.c_int]
    sgemm.argtypes += [ctypes.c_float, fp, ctypes.c_int]
    sgemm.restype = None
    a = np.ones((m, k), np.float32)
    b = np.ones((k, n), np.float32)
    c = np.empty((m, n), np.float32)
    args = (101, 111, 111, m, n, k, 1.0, a.ctypes.data, k, b.ctypes.data, n, 0.0, c.ctypes.data, n)
    previous = blas.get_blas_threads()
    blas.set_blas_threads(threads)
    try:
        for _ in range(2):
            sgemm(*args)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            sgemm(*args)
            times.append(time.perf_counter() - t0)
    finally:
        blas.set_blas_threads(previous)
    return statistics.median(times)


def _compile(model: onnx.ModelProto, threads: int, cache: KernelCache) -> tuple[CompiledModel, str]:
    """The model fused and compiled by the runtime itself, and the anchor's method.

    Through `compile_model`, not by calling a generated kernel by hand: the runtime is what builds
    a kernel's arguments (its workspace, the weights it packs once with `<symbol>_prepack`), so
    the benchmark times exactly what a user runs and cannot fall out of step when that changes.
    """
    compiled = compile_model(gaf.fuse(model).model, cache=cache, threads=threads)
    kernels = compiled.stats["per_kernel"]
    if len(kernels) != 1 or compiled.stats["host_ops"]:
        raise RuntimeError(
            f"expected one anchor kernel, got {[k['template'] for k in kernels]} and host ops "
            f"{compiled.stats['host_ops']}: the benchmark would not time one anchor"
        )
    return compiled, kernels[0]["method"]


def run(
    shapes: list[Shape], thread_counts: list[int], reps: int, cache: KernelCache, ort_spin: bool = True
) -> list[Row]:
    rng = np.random.default_rng(0)
    rows: list[Row] = []
    # One core's FMA peak by process CPU time (a busy neighbour cannot make it look lower, as it
    # can a wall-clock figure), times the threads.
    set_omp_threads(1)
    core_peak = peak_flops(build_library(cache=cache), clock=time.process_time)
    peaks = {nt: core_peak * nt for nt in thread_counts}
    for shape in shapes:
        model, values = _model(shape, rng)
        feeds = {"x": values["x"]}
        out_shape = tuple(d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim)
        if shape.kind == "conv":
            cin, _, _, k, _, group = shape.dims
            flops = 2 * int(np.prod(out_shape)) * (cin // group) * k * k
        else:
            m, kk, n = shape.dims
            flops = 2 * m * kk * n
        for nt in thread_counts:
            compiled, method = _compile(model, nt, cache)
            opts = ort.SessionOptions()
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            opts.intra_op_num_threads = nt
            opts.inter_op_num_threads = 1
            if not ort_spin:
                opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
            sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
            ours_t, theirs_t = _time_pair(partial(compiled.run, feeds), partial(sess.run, None, feeds), reps)
            ours, theirs = statistics.median(ours_t), statistics.median(theirs_t)
            want = sess.run(None, feeds)[0]
            got = compiled.run(feeds)["o"]
            mnk = _plain_gemm(shape)
            blas_s = _blas_time(mnk, nt, reps) if mnk is not None else None
            rows.append(
                Row(
                    shape=shape.name,
                    method=method,
                    threads=nt,
                    ours_ms=ours * 1e3,
                    ort_ms=theirs * 1e3,
                    ratio=ours / theirs,
                    ours_min_ms=min(ours_t) * 1e3,
                    ort_min_ms=min(theirs_t) * 1e3,
                    gflops=flops / ours / 1e9,
                    peak_pct=100 * flops / ours / peaks[nt],
                    max_abs_err=float(np.max(np.abs(got - want))),
                    blas_ms=None if blas_s is None else blas_s * 1e3,
                )
            )
            compiled.close()
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    parser.add_argument("--reps", type=int, default=15, help="timed runs per measurement (median)")
    parser.add_argument("--only", choices=["resnet", "dw", "bert", "transformer"], help="one shape family")
    parser.add_argument("--json", action="store_true", help="print rows as JSON")
    parser.add_argument(
        "--omp-dynamic",
        action="store_true",
        help="let libgomp shrink the team when the machine is busy (omp_set_dynamic(1))",
    )
    parser.add_argument(
        "--no-ort-spin",
        action="store_true",
        help="stop onnxruntime's pool from spinning after a run (it can starve our OpenMP threads)",
    )
    args = parser.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",")]
    if args.omp_dynamic:
        gomp = ctypes.CDLL(ctypes.util.find_library("gomp") or "libgomp.so.1", mode=ctypes.RTLD_GLOBAL)
        gomp.omp_set_dynamic(1)
    shapes = [s for s in SHAPES if args.only in (None, s.family)]
    print(describe_host(), file=sys.stderr if args.json else sys.stdout, flush=True)
    with tempfile.TemporaryDirectory(prefix="af-bench-anchors-") as tmp:
        rows = run(shapes, threads, args.reps, KernelCache(tmp), ort_spin=not args.no_ort_spin)
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=2))
        return
    head = f"{'shape':27} {'method':17} {'thr':>3} {'ours ms':>8} {'ort ms':>8} {'ratio':>5}"
    print(
        head + f" {'ours min':>8} {'ort min':>8} {'ratio':>5} {'GFLOP/s':>7} {'peak%':>5} {'max err':>7}"
        f" {'blas/ours':>9}"
    )
    for r in rows:
        print(
            f"{r.shape:27} {r.method:17} {r.threads:3d} {r.ours_ms:8.3f} {r.ort_ms:8.3f} {r.ratio:5.2f} "
            f"{r.ours_min_ms:8.3f} {r.ort_min_ms:8.3f} {r.ours_min_ms / r.ort_min_ms:5.2f} {r.gflops:7.1f} "
            f"{r.peak_pct:5.0f} {r.max_abs_err:7.1e} "
            + (f"{r.blas_ms / r.ours_ms:9.2f}" if r.blas_ms else f"{'-':>9}")
        )
    for nt in threads:
        ratios = [r.ratio for r in rows if r.threads == nt]
        geo = float(np.exp(np.mean(np.log(ratios))))
        mins = [r.ours_min_ms / r.ort_min_ms for r in rows if r.threads == nt]
        geo_min = float(np.exp(np.mean(np.log(mins))))
        print(
            f"threads={nt}: ours/ort geometric mean {geo:.2f} (medians), {geo_min:.2f} (minimums); "
            f"worst {max(ratios):.2f} / {max(mins):.2f}"
        )


if __name__ == "__main__":
    main()
