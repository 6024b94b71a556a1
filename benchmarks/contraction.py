"""Contraction speed per shape: the contraction library against OpenBLAS, as the anchors use them.

For each large Conv / MatMul shape of the zoo (ResNet-50, MobileNetV2, BERT-base), a one-node ONNX
model with its weights as initializers is compiled twice, `AUTOFUSION_CONTRACTION=blas` (one
single-threaded OpenBLAS sgemm per output tile, which packs both operands every call) and
`library` (the contraction library: weights packed once at load, the activation per tile), and
the two are timed in alternating rounds in one process (the machine is shared: a disturbance then
hits both). Each row gives GFLOP/s (2*M*N*K per call; median and fastest run) of both, next to
OpenBLAS's own sgemm on the bare GEMM with as many threads (no im2col, no tiling: what BLAS does
alone) and the ISA's FMA peak on the same threads (`shim.peak_flops`: register-only FMA chains).

`--cpu-time` times each call by the process's CPU time instead of the wall clock, which a busy
shared host cannot disturb by preempting the process (it still can by evicting caches); use it
with `--threads 1` (with more threads it sums the threads' time, spin-waits included).

`--models resnet50,bert_base` instead compares whole fused zoo models: both contraction modes
compiled side by side with one thread, every kernel timed by process CPU time, the two models'
runs interleaved (the load of a shared host drifts), the fastest run of each kernel kept; it prints
the total and the anchors' GFLOP/s per mode. That is the measurement behind the default mode
(contraction/__init__.py). With `--wall` it instead times whole runs on `--threads` threads by
the wall clock, both modes and onnxruntime (ORT_ENABLE_ALL, same threads) interleaved run by run,
and prints the median and fastest run of each.

`--layers resnet50` instead lists a fused zoo model's conv/matmul anchors one by one against
onnxruntime's nodes (ORT_ENABLE_ALL, its own per-node profile): both on `--threads` threads, the
fastest of `--reps` runs of each kernel (ours: process CPU time with one thread, the wall clock
with more; onnxruntime: its profiler's per-node time), paired by (input shape, weight shape) in
execution order (by input and output shapes where onnxruntime's profile leaves out a weight it
pre-packed: GPT-2's Gemms, a MatMul's constant weight; a chain's row by both its products, their
times summed), with GFLOP/s and the share of the ISA's FMA peak on those threads, the biggest
losers (ms ours - ms onnxruntime) first. The runs are split into LAYER_ROUNDS rounds, each
profiling onnxruntime's nodes, then OpenVINO's, then ours, in blocks of their own (its threads spin
after a run), each after runtime_speed.py's SETTLE_SECONDS of quiet: on a host whose speed drifts
for minutes, one block each had put a slow stretch in one column only (ResNet-50's anchors read
1.20x onnxruntime in one such run, 1.04x in the next, same code, Zen 4), and without the pause our
block ran beside OpenVINO's spinning threads (ResNet-50's anchors 17.34 ms, 0.91x onnxruntime and
0.94x OpenVINO; with it 15.71 ms, 0.86x and 0.88x; Zen 5, two threads). With OpenVINO installed,
its contraction nodes (`PERF_COUNT`, fastest of `--reps`, configured as runtime_speed.py does)
fill an `ov ms` column, paired in execution order in a conv net where it runs as many as we do, of
the same kinds (conv or matrix product) in the same order (empty otherwise: a transformer's node
count can agree with ours while their orders differ).

With `--scaling` (and `--layers`), the per-layer profile is taken on one thread and on `--threads`
and the table gives each paired layer's speedup from one thread to `--threads`, ours and
onnxruntime's, with the time the layer loses to the parallel run beyond what onnxruntime loses
(`lost ms`: ours at N threads minus ours at one / N, less the same for onnxruntime), the biggest
first. Why: on a host where our kernels match onnxruntime on one thread, a model can still trail it
on two (MobileNetV2 on an Intel Xeon host: anchors 1.00x onnxruntime on one thread, 1.15x on two;
its depthwise convs at 14x14 and 28x28 ran slower on two threads than on one, onnxruntime's
1.45-1.5x faster: lower/conv.py `_depthwise_tasks` says what was changed), and only the two
profiles side by side tell the kernels' speed from their scaling.

Run: `.venv/bin/python benchmarks/contraction.py [--threads 2] [--reps 20] [--shapes resnet50,bert]
[--cpu-time] [--models resnet50,mobilenet_v2,bert_base] [--layers resnet50 [--scaling]] [--json]`; the header
names the host (`describe_host`) and the OpenBLAS core in use.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from graph_autofusion.backend.cpu import blas, threads
from graph_autofusion.backend.cpu.contraction import CONTRACTION_ENV
from graph_autofusion.backend.cpu.contraction.shim import build_library, peak_flops
from graph_autofusion.backend.cpu.kernel_spec import KernelSpec
from graph_autofusion.backend.cpu.runtime import compile_model
from graph_autofusion.hardware import describe_host


@dataclass(frozen=True)
class Shape:
    """A Conv (`kernel` > 0: input [1, cin, hw, hw], `stride`) or a MatMul [m, k] x [k, n]."""

    name: str
    cin: int  # Conv: input channels; MatMul: K
    cout: int  # Conv: output channels; MatMul: N
    hw: int = 0  # Conv: input height = width; MatMul: M
    kernel: int = 0
    stride: int = 1

    @property
    def gemm(self) -> tuple[int, int, int]:
        """(M, N, K) of the contraction."""
        if not self.kernel:
            return self.hw, self.cout, self.cin
        pad = self.kernel // 2
        out = (self.hw + 2 * pad - self.kernel) // self.stride + 1
        return self.cout, out * out, self.cin * self.kernel * self.kernel

    def model(self, rng: np.random.Generator) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
        if self.kernel:
            pad = self.kernel // 2
            x = rng.standard_normal((1, self.cin, self.hw, self.hw)).astype(np.float32)
            w = rng.standard_normal((self.cout, self.cin, self.kernel, self.kernel)).astype(np.float32)
            node = helper.make_node(
                "Conv",
                ["x", "w"],
                ["y"],
                kernel_shape=[self.kernel] * 2,
                pads=[pad] * 4,
                strides=[self.stride] * 2,
            )
        else:
            x = rng.standard_normal((self.hw, self.cin)).astype(np.float32)
            w = rng.standard_normal((self.cin, self.cout)).astype(np.float32)
            node = helper.make_node("MatMul", ["x", "w"], ["y"])
        graph = helper.make_graph(
            [node],
            self.name,
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
            [numpy_helper.from_array(w, "w")],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        return onnx.shape_inference.infer_shapes(model), {"x": x}


SHAPES = {
    "resnet50": [
        Shape("r50.conv1 7x7s2", 3, 64, 224, 7, 2),
        Shape("r50.l1 3x3", 64, 64, 56, 3),
        Shape("r50.l1 1x1 up", 64, 256, 56, 1),
        Shape("r50.l1 1x1 down", 256, 64, 56, 1),
        Shape("r50.l2 3x3", 128, 128, 28, 3),
        Shape("r50.l2 1x1 up", 128, 512, 28, 1),
        Shape("r50.l3 3x3", 256, 256, 14, 3),
        Shape("r50.l3 1x1 up", 256, 1024, 14, 1),
        Shape("r50.l4 3x3", 512, 512, 7, 3),
        Shape("r50.l4 1x1 up", 512, 2048, 7, 1),
    ],
    "mobilenet_v2": [
        Shape("mv2 1x1 16->96 @112", 16, 96, 112, 1),
        Shape("mv2 1x1 32->192 @28", 32, 192, 28, 1),
        Shape("mv2 1x1 320->1280 @7", 320, 1280, 7, 1),
    ],
    "bert": [
        Shape("bert qkv/out 128x768x768", 768, 768, 128),
        Shape("bert ffn1 128x3072x768", 768, 3072, 128),
        Shape("bert ffn2 128x768x3072", 3072, 768, 128),
    ],
}


@dataclass
class Row:
    shape: str
    m: int
    n: int
    k: int
    blas_gflops: float
    library_gflops: float
    blas_best_gflops: float
    library_best_gflops: float
    blas_alone_gflops: float
    peak_gflops: float

    @property
    def speedup(self) -> float:
        return self.library_gflops / self.blas_gflops


CLOCK: Callable[[], float] = time.perf_counter


def _time(fns: dict[str, Callable[[], object]], reps: int) -> dict[str, list[float]]:
    """Seconds per call of each contender, in alternating rounds (one warm-up call each first)."""
    out: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn()
    for _ in range(reps):
        for name, fn in fns.items():
            start = CLOCK()
            fn()
            out[name].append(CLOCK() - start)
    return out


def _blas_alone(m: int, n: int, k: int, nthreads: int, reps: int) -> float:
    """Median GFLOP/s of OpenBLAS's own multi-threaded sgemm on the bare [m, k] x [k, n]."""
    lib = blas.load_blas()
    sgemm = lib.scipy_cblas_sgemm
    sgemm.restype = None
    ptr, i32, f32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    sgemm.argtypes = [i32] * 6 + [f32, ptr, i32, ptr, i32, f32, ptr, i32]
    rng = np.random.default_rng(1)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    c = np.empty((m, n), np.float32)
    before = blas.get_blas_threads()
    blas.set_blas_threads(nthreads)
    try:

        def call() -> None:
            sgemm(101, 111, 111, m, n, k, 1.0, a.ctypes.data, k, b.ctypes.data, n, 0.0, c.ctypes.data, n)

        times = _time({"blas": call}, reps)["blas"]
    finally:
        blas.set_blas_threads(before)
    return 2 * m * n * k / statistics.median(times) / 1e9


def measure(shapes: list[Shape], nthreads: int, reps: int) -> tuple[list[Row], float]:
    threads.set_omp_threads(nthreads)
    peak = peak_flops(build_library(), clock=CLOCK) / 1e9
    rows = []
    rng = np.random.default_rng(0)
    saved = os.environ.get(CONTRACTION_ENV)
    try:
        for shape in shapes:
            model, feeds = shape.model(rng)
            compiled = {}
            for mode in ("blas", "library"):
                os.environ[CONTRACTION_ENV] = mode
                compiled[mode] = compile_model(model, threads=nthreads)
            ref = compiled["blas"](feeds)["y"]
            got = compiled["library"](feeds)["y"]
            assert np.allclose(got, ref, rtol=1e-4, atol=1e-3 * float(np.abs(ref).max())), shape.name
            times = _time({mode: (lambda cm=cm, f=feeds: cm(f)) for mode, cm in compiled.items()}, reps)
            m, n, k = shape.gemm
            flop = 2 * m * n * k / 1e9
            rows.append(
                Row(
                    shape.name,
                    m,
                    n,
                    k,
                    round(flop / statistics.median(times["blas"]), 1),
                    round(flop / statistics.median(times["library"]), 1),
                    round(flop / min(times["blas"]), 1),
                    round(flop / min(times["library"]), 1),
                    round(_blas_alone(m, n, k, nthreads, reps), 1),
                    round(peak, 1),
                )
            )
            print(_line(rows[-1]), flush=True)
    finally:
        if saved is None:
            os.environ.pop(CONTRACTION_ENV, None)
        else:
            os.environ[CONTRACTION_ENV] = saved
    return rows, peak


def _anchor_macs(spec: KernelSpec) -> int:
    """Multiply-adds of a kernel's Conv/MatMul/Gemm nodes (0: not an anchor)."""
    total = 0
    for node in spec.nodes:
        if node.op_type in ("Conv", "MatMul", "Gemm"):
            out = math.prod(spec.tensors[node.output[0]].shape)
            if node.op_type == "Conv":
                total += out * math.prod(spec.tensors[node.input[1]].shape[1:])
            else:
                left = spec.tensors[node.input[0]].shape
                trans = node.op_type == "Gemm" and any(a.name == "transA" and a.i for a in node.attribute)
                total += out * (left[0] if trans else left[-1])
    return total


def compare_models(names: list[str], reps: int) -> list[dict[str, object]]:
    """Whole fused models, both modes, one thread, kernels timed by CPU time (module docstring)."""
    import graph_autofusion as gaf
    from graph_autofusion import zoo
    from graph_autofusion.backend.cpu.extract import KernelStep

    out = []
    saved = os.environ.get(CONTRACTION_ENV)
    try:
        for name in names:
            source = zoo.build(name)
            fused = gaf.fuse(source).model
            feeds = zoo.example_inputs(source)
            compiled = {}
            for mode in ("blas", "library"):
                os.environ[CONTRACTION_ENV] = mode
                compiled[mode] = compile_model(fused, threads=1)
                compiled[mode](feeds)
            threads.set_omp_threads(1)
            best = {mode: [math.inf] * len(cm._per_kernel) for mode, cm in compiled.items()}
            for _ in range(reps):
                for mode, cm in compiled.items():
                    for i, (fn, argv) in enumerate(cm._per_kernel):
                        start = time.process_time_ns()
                        fn(argv)
                        best[mode][i] = min(best[mode][i], time.process_time_ns() - start)
            row: dict[str, object] = {"model": name}
            for mode, cm in compiled.items():
                steps = [s for s in cm._steps if isinstance(s, KernelStep)]
                macs = [_anchor_macs(cm.plan.specs[s.symbol]) for s in steps]
                anchor_ns = sum(t for t, m in zip(best[mode], macs, strict=True) if m)
                row[f"{mode}_ms"] = round(sum(best[mode]) / 1e6, 2)
                row[f"{mode}_anchor_gflops"] = round(2 * sum(macs) / anchor_ns, 1)
                row[f"{mode}_packed_bytes"] = cm.stats["packed_weights_bytes"]
            print(
                f"{name:<14} blas {row['blas_ms']:>8} ms ({row['blas_anchor_gflops']:>5} GFLOP/s in anchors)"
                f"  library {row['library_ms']:>8} ms ({row['library_anchor_gflops']:>5} GFLOP/s)"
                f"  library/blas {float(row['library_ms']) / float(row['blas_ms']):.3f}"  # type: ignore[arg-type]
                f"  packed {int(row['library_packed_bytes']) / 2**20:.1f} MiB",  # type: ignore[call-overload]
                flush=True,
            )
            out.append(row)
    finally:
        if saved is None:
            os.environ.pop(CONTRACTION_ENV, None)
        else:
            os.environ[CONTRACTION_ENV] = saved
    return out


def compare_models_wall(names: list[str], nthreads: int, reps: int) -> list[dict[str, object]]:
    """Whole fused models on `nthreads` threads, wall clock, both modes and onnxruntime interleaved."""
    import onnxruntime as ort

    import graph_autofusion as gaf
    from graph_autofusion import zoo

    out = []
    saved = os.environ.get(CONTRACTION_ENV)
    try:
        for name in names:
            source = zoo.build(name)
            fused = gaf.fuse(source).model
            feeds = zoo.example_inputs(source)
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = nthreads
            sess = ort.InferenceSession(source.SerializeToString(), opts, providers=["CPUExecutionProvider"])
            runs: dict[str, Callable[[], object]] = {"onnxruntime": lambda s=sess, f=feeds: s.run(None, f)}
            for mode in ("blas", "library"):
                os.environ[CONTRACTION_ENV] = mode
                runs[mode] = lambda cm=compile_model(fused, threads=nthreads), f=feeds: cm(f)
            times = _time(runs, reps)
            row: dict[str, object] = {"model": name, "threads": nthreads}
            for who, ts in times.items():
                row[f"{who}_ms"] = round(1e3 * statistics.median(ts), 2)
                row[f"{who}_min_ms"] = round(1e3 * min(ts), 2)
            print(
                f"{name:<14} "
                + "  ".join(f"{who} {row[f'{who}_ms']} ms (min {row[f'{who}_min_ms']})" for who in times),
                flush=True,
            )
            out.append(row)
    finally:
        if saved is None:
            os.environ.pop(CONTRACTION_ENV, None)
        else:
            os.environ[CONTRACTION_ENV] = saved
    return out


Dims = tuple[int, ...]
AnchorKey = tuple[tuple[Dims, Dims], tuple[Dims, Dims], str]


def _anchor_keys(spec: KernelSpec) -> list[AnchorKey]:
    """((input shape, weight shape), (input shape, output shape), op) of each of a kernel's
    Conv/MatMul/Gemm nodes (two in a chain), in order; empty without one."""
    keys = []
    for node in spec.nodes:
        if node.op_type in ("Conv", "MatMul", "Gemm"):
            shape = spec.tensors
            x, w, y = (tuple(shape[n].shape) for n in (node.input[0], node.input[1], node.output[0]))
            keys.append(((x, w), (x, y), node.op_type))
    return keys


def ort_node_times(
    model: onnx.ModelProto, feeds: dict[str, np.ndarray], nthreads: int, reps: int
) -> list[dict[str, object]]:
    """onnxruntime's (ORT_ENABLE_ALL) Conv/MatMul/Gemm nodes in execution order: name, op, the
    (input shape, weight shape) key and the fastest per-node time (ms) over `reps` profiled runs
    (after a warm-up run that is not kept)."""
    import tempfile

    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = nthreads
    opts.enable_profiling = True
    opts.profile_file_prefix = os.path.join(tempfile.mkdtemp(prefix="ort-profile-"), "ort")
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    for _ in range(reps + 1):
        sess.run(None, feeds)
    with open(sess.end_profiling()) as fh:
        events = json.load(fh)
    runs: list[list[dict]] = []
    for ev in events:
        if ev.get("cat") == "Session" and ev.get("name") == "model_run":
            runs.append([])
        elif ev.get("cat") == "Node" and ev["name"].endswith("_kernel_time") and runs:
            runs[-1].append(ev)
    runs = runs[1:] or runs  # the first run is the warm-up
    rows = []
    for i, ev in enumerate(runs[0]):
        args = ev["args"]
        if not any(op in args.get("op_name", "") for op in ("Conv", "MatMul", "Gemm")):
            continue
        shapes = [tuple(next(iter(t.values()))) for t in args.get("input_type_shape", [])]
        outs = [tuple(next(iter(t.values()))) for t in args.get("output_type_shape", [])]
        if not shapes:
            continue
        best = min(float(r[i]["dur"]) for r in runs if i < len(r) and r[i]["name"] == ev["name"])
        # a weight onnxruntime pre-packed is missing from the node's profiled inputs (GPT-2's
        # Conv1D Gemm lists the activation and the bias): such a node pairs by its output shape
        key = (shapes[0], shapes[1] if len(shapes) > 1 else ())
        rows.append({"node": ev["name"].removesuffix("_kernel_time"), "op": args["op_name"], "key": key,
                     "out_key": (shapes[0], outs[0]) if outs else None, "ms": best / 1e3})  # fmt: skip
    return rows


# OpenVINO's contraction nodes in its per-node profile (`PERF_COUNT`), by the ONNX op kind they run
OV_CONTRACTIONS = {
    "Convolution": "Conv",
    "GroupConvolution": "Conv",
    "FullyConnected": "Gemm",
    "MatMul": "Gemm",
}


def _runtime_speed():  # type: ignore[no-untyped-def]
    """runtime_speed.py, beside this file: OpenVINO's configuration and the settle pause are the
    ones its whole-model runs use (imported on first use: it loads onnxruntime)."""
    if os.path.dirname(os.path.abspath(__file__)) not in sys.path:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import runtime_speed

    return runtime_speed


def ov_node_times(
    model: onnx.ModelProto, feeds: dict[str, np.ndarray], nthreads: int, reps: int
) -> list[tuple[str, float]] | None:
    """OpenVINO's contraction nodes (OV_CONTRACTIONS) in execution order, each as the ONNX op kind
    it runs (`Conv` or `Gemm`) and its fastest time (ms) over `reps` profiled runs, configured as
    runtime_speed.py runs it; None when OpenVINO is not installed."""
    import tempfile

    try:
        import openvino as ov
    except ImportError:
        return None
    path = os.path.join(tempfile.mkdtemp(prefix="ov-profile-"), "model.onnx")
    onnx.save(model, path)
    core = ov.Core()
    config = {**_runtime_speed().OPENVINO_CONFIG, "INFERENCE_NUM_THREADS": nthreads, "PERF_COUNT": True}
    request = core.compile_model(core.read_model(path), "CPU", config).create_infer_request()
    request.infer(dict(feeds))  # warm-up, not kept
    best: dict[str, tuple[str, float]] = {}
    for _ in range(reps):
        request.infer(dict(feeds))
        for info in request.get_profiling_info():
            if info.node_type in OV_CONTRACTIONS:
                ms = info.real_time.total_seconds() * 1e3
                kept = best.get(info.node_name, ("", math.inf))[1]
                best[info.node_name] = (OV_CONTRACTIONS[info.node_type], min(kept, ms))
    return list(best.values())  # dicts keep the first run's order: execution order


# --layers profiles the three runtimes in this many alternating rounds (each `reps` / ROUNDS runs)
LAYER_ROUNDS = 3


def _rounds(reps: int) -> list[int]:
    """`reps` runs split into up to LAYER_ROUNDS rounds of at least two runs each (a profile of
    one run reads back no nodes from onnxruntime's profile)."""
    count = max(1, min(LAYER_ROUNDS, reps // 2))
    return [reps // count + (i < reps % count) for i in range(count)]


def _fastest_rows(kept: list[dict[str, object]], new: list[dict[str, object]]) -> list[dict[str, object]]:
    """onnxruntime's node rows of two rounds, each node's faster time (the same session options
    run the same nodes in the same order every round)."""
    if not kept:
        return new
    if [r["node"] for r in kept] != [r["node"] for r in new]:
        raise RuntimeError("onnxruntime ran different nodes in two profiling rounds")
    return [{**a, "ms": min(float(a["ms"]), float(b["ms"]))} for a, b in zip(kept, new, strict=True)]  # type: ignore[arg-type]


def compare_layers(
    source: onnx.ModelProto, feeds: dict[str, np.ndarray], nthreads: int, reps: int
) -> list[dict[str, object]]:
    """A model's fused anchors, ours vs onnxruntime's nodes, layer by layer (module docstring)."""
    import graph_autofusion as gaf
    from graph_autofusion.backend.cpu.extract import KernelStep

    pause = _runtime_speed().SETTLE_SECONDS

    fused = gaf.fuse(source)
    cm = compile_model(fused.model, threads=nthreads)
    cm(feeds)
    clock = time.process_time_ns if nthreads == 1 else time.perf_counter_ns
    best = [math.inf] * len(cm._per_kernel)
    library, peak = build_library(), 0.0
    theirs: list[dict[str, object]] = []
    ov_times: list[tuple[str, float]] | None = None
    for share in _rounds(reps):
        # each round profiles onnxruntime, OpenVINO and ours in turn: a slow stretch of the host
        # then lands in every column's minimum alike instead of in one column's whole block; each
        # after SETTLE_SECONDS of quiet, so that none runs beside the previous one's spinning
        # threads (without the pause, ResNet-50's 256 -> 1024 1x1s at 14x14 read 0.26-0.28 ms
        # here, after OpenVINO's block, 0.22-0.23 with it, as in the model's own profile: Zen 5)
        time.sleep(pause)
        theirs = _fastest_rows(theirs, ort_node_times(source, feeds, nthreads, share))
        time.sleep(pause)
        ov_round = ov_node_times(fused.canonical_reference, feeds, nthreads, share)
        if ov_times is None or ov_round is None:
            ov_times = ov_round
        else:
            ov_times = [(a[0], min(a[1], b[1])) for a, b in zip(ov_times, ov_round, strict=True)]
        threads.set_omp_threads(nthreads)
        time.sleep(pause)
        for _ in range(share + 1):
            for i, (fn, argv) in enumerate(cm._per_kernel):
                start = clock()
                fn(argv)
                best[i] = min(best[i], clock() - start)
        # the peak of each round too, the fastest kept as the kernels' are: one probe taken in a
        # slow stretch read 204 GFLOP/s on the Zen 4 host (228 when quiet), every %peak 12% high
        peak = max(peak, peak_flops(library, clock=time.process_time if nthreads == 1 else time.perf_counter))
    pending: dict[tuple, list[dict[str, object]]] = {}
    by_output: dict[tuple, list[dict[str, object]]] = {}
    for row in theirs:
        pending.setdefault(row["key"], []).append(row)  # type: ignore[arg-type]
        if row["out_key"] is not None:
            by_output.setdefault(row["out_key"], []).append(row)  # type: ignore[arg-type]
    taken: set[str] = set()

    def peer_of(key: AnchorKey) -> dict[str, object] | None:
        """onnxruntime's first unpaired node of the same (input, weight) shapes, else of the same
        (input, output) shapes and op (a Gemm whose weight its profile leaves out)."""
        for row in pending.get(key[0], []):
            if row["node"] not in taken:
                taken.add(str(row["node"]))
                return row
        for row in by_output.get(key[1], []):
            if row["node"] not in taken and key[2] in str(row["op"]):  # Gemm in FusedGemm
                taken.add(str(row["node"]))
                return row
        return None

    steps = [s for s in cm._steps if isinstance(s, KernelStep)]
    out = []
    ops = []
    for step, ns in zip(steps, best, strict=True):
        spec = cm.plan.specs[step.symbol]
        keys = _anchor_keys(spec)
        macs = _anchor_macs(spec)
        if not keys or not macs:
            continue
        key = keys[0][0]
        ops.extend(k[2] for k in keys)
        # a chain's row pairs with onnxruntime's nodes of both its products, their times summed
        peers = [peer_of(k) for k in keys]
        peer = peers[0] if all(peers) else None
        if peer is None:  # a chain half found alone stays free for another row
            taken.difference_update(str(p["node"]) for p in peers if p)
        ms = ns / 1e6
        ort_ms = sum(float(p["ms"]) for p in peers if p) if peer else math.nan  # type: ignore[arg-type]
        out.append({
            "node": step.node_name, "x": list(key[0]), "w": list(key[1]), "ms": round(ms, 4),
            "then": [list(k[0][1]) for k in keys[1:]],
            "ort_ms": round(ort_ms, 4), "gflops": round(2 * macs / ns, 1),
            "ort_gflops": round(2 * macs / (ort_ms * 1e6), 1) if peer else math.nan,
            "peak_pct": round(100 * 2 * macs / ns / (peak / 1e9), 1),
        })  # fmt: skip
    # OpenVINO's nodes pair with our anchors in execution order in a conv net (both fuse each conv
    # with its epilogue) where it runs as many, of the same kinds in the same order (ResNet-50's
    # classifier Gemm is its FullyConnected); otherwise the column stays empty (a transformer's
    # counts can agree while the orders do not: GPT-2's read 0.17x and 1.97x)
    kinds = ["Conv" if op == "Conv" else "Gemm" for op in ops]
    in_order = (
        ov_times is not None
        and "Conv" in kinds
        and len(ops) == len(out)
        and [kind for kind, _ in ov_times] == kinds
    )
    ov_ms = [ms for _, ms in ov_times] if in_order and ov_times else [math.nan] * len(out)
    for row, ms in zip(out, ov_ms, strict=True):
        row["ov_ms"] = round(ms, 4)
    return out


def _layer_label(row: dict[str, object]) -> str:
    """A layer as its input (without the batch) and weight shapes: `64x56x56 -> 64x64x3x3`; a
    chain's with its second weight after them."""
    x, w = row["x"], row["w"]
    then = "".join(f" -> {'x'.join(map(str, v))}" for v in row.get("then", []))  # type: ignore[attr-defined]
    return f"{'x'.join(map(str, x[1:]))} -> {'x'.join(map(str, w))}{then}"  # type: ignore[index, call-overload]


def _layer_lines(rows: list[dict[str, object]], nthreads: int) -> list[str]:
    """The per-layer table, biggest losers first, and the totals."""
    lines = [
        f"{'layer (x -> w)':<44} {'ours ms':>8} {'ort ms':>8} {'ratio':>6} {'GF/s':>6} {'ort':>6} "
        f"{'%peak':>6} {'ov ms':>8} {'/ov':>6}"
    ]
    for r in sorted(rows, key=lambda r: -(float(r["ms"]) - float(r["ort_ms"]))):  # type: ignore[arg-type]
        label = _layer_label(r)
        ratio = float(r["ms"]) / float(r["ort_ms"])  # type: ignore[arg-type]
        ov = float(r["ov_ms"])  # type: ignore[arg-type]
        lines.append(
            f"{label:<44} {r['ms']:>8.3f} {r['ort_ms']:>8.3f} {ratio:>6.2f} {r['gflops']:>6} "
            f"{r['ort_gflops']:>6} {r['peak_pct']:>6} {ov:>8.3f} {float(r['ms']) / ov:>6.2f}"  # type: ignore[arg-type]
        )
    paired = [r for r in rows if not math.isnan(float(r["ort_ms"]))]  # type: ignore[arg-type]
    ours = sum(float(r["ms"]) for r in paired)  # type: ignore[arg-type]
    theirs = sum(float(r["ort_ms"]) for r in paired)  # type: ignore[arg-type]
    label = f"all anchors, {nthreads} thread(s)"
    if len(paired) < len(rows):  # no onnxruntime node of the same shapes (it fused it otherwise)
        alone = sum(float(r["ms"]) for r in rows) - ours  # type: ignore[arg-type]
        label = f"{len(paired)} paired anchors (+{alone:.2f} ms unpaired)"
    lines.append(f"{label:<44} {ours:>8.2f} {theirs:>8.2f} {ours / max(theirs, 1e-9):>6.2f}")
    ov_total = sum(float(r["ov_ms"]) for r in rows)  # type: ignore[arg-type]
    if not math.isnan(ov_total):
        total = sum(float(r["ms"]) for r in rows)  # type: ignore[arg-type]
        ratio = total / ov_total
        lines.append(f"{'all anchors vs OpenVINO':<44} {total:>8.2f} {ov_total:>8.2f} {ratio:>6.2f}")
    return lines


def _scaling_lines(one: list[dict[str, object]], many: list[dict[str, object]], nthreads: int) -> list[str]:
    """The per-layer scaling table (module docstring): `one` and `many` are compare_layers' rows of
    the same model on one thread and on `nthreads`, in the same order; layers without an
    onnxruntime node of their shapes are left out."""
    if [(r["x"], r["w"]) for r in one] != [(r["x"], r["w"]) for r in many]:
        raise ValueError("the one-thread and the parallel profile list different anchors")
    rows = []
    for a, b in zip(one, many, strict=True):
        pairs = ((a, "ms"), (b, "ms"), (a, "ort_ms"), (b, "ort_ms"))
        ours1, oursn, ort1, ortn = (float(r[k]) for r, k in pairs)  # type: ignore[arg-type]
        if math.isnan(ort1) or math.isnan(ortn):
            continue
        lost = (oursn - ours1 / nthreads) - (ortn - ort1 / nthreads)
        rows.append((lost, a, ours1, oursn, ort1, ortn))
    lines = [
        f"{'layer (x -> w)':<44} {'ours 1':>7} {f'ours {nthreads}':>7} {'x':>5} {'ort 1':>7} "
        f"{f'ort {nthreads}':>7} {'x':>5} {'lost ms':>8}"
    ]
    for lost, a, ours1, oursn, ort1, ortn in sorted(rows, key=lambda r: -r[0]):
        label = _layer_label(a)
        lines.append(
            f"{label:<44} {ours1:>7.3f} {oursn:>7.3f} {ours1 / oursn:>5.2f} {ort1:>7.3f} {ortn:>7.3f} "
            f"{ort1 / ortn:>5.2f} {lost:>8.3f}"
        )
    totals = [sum(r[i] for r in rows) for i in (2, 3, 4, 5)]
    lines.append(
        f"{f'{len(rows)} paired anchors':<44} {totals[0]:>7.2f} {totals[1]:>7.2f} "
        f"{totals[0] / max(totals[1], 1e-9):>5.2f} {totals[2]:>7.2f} {totals[3]:>7.2f} "
        f"{totals[2] / max(totals[3], 1e-9):>5.2f} {sum(r[0] for r in rows):>8.3f}"
    )
    return lines


def _line(r: Row) -> str:
    return (
        f"{r.shape:<28} {r.m:>5} {r.n:>6} {r.k:>5}  {r.blas_gflops:>7.1f} ({r.blas_best_gflops:>5.1f})"
        f"  {r.library_gflops:>7.1f} ({r.library_best_gflops:>5.1f})  {r.speedup:>5.2f}x"
        f"  {r.blas_alone_gflops:>7.1f}  {100 * r.library_gflops / r.peak_gflops:>5.0f}%"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"groups of shapes: {', '.join(SHAPES)}")
    parser.add_argument("--cpu-time", action="store_true", help="time by process CPU time (see above)")
    parser.add_argument("--models", default="", help="compare whole zoo models instead (see above)")
    parser.add_argument("--wall", action="store_true", help="with --models: wall clock, --threads, vs ORT")
    parser.add_argument("--layers", default="", help="one zoo model's anchors vs onnxruntime's (see above)")
    parser.add_argument(
        "--scaling", action="store_true", help="with --layers: one thread against --threads, layer by layer"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.scaling and (not args.layers or args.threads < 2):
        parser.error("--scaling compares one thread with --threads (2 or more) on the --layers model")
    if args.cpu_time:
        global CLOCK
        CLOCK = time.process_time
    shapes = [s for group in args.shapes.split(",") for s in SHAPES[group.strip()]]
    lib = blas.load_blas()
    lib.scipy_openblas_get_corename.restype = ctypes.c_char_p
    core = lib.scipy_openblas_get_corename().decode()
    kernel = build_library().kernel
    header = [
        describe_host(),
        f"OpenBLAS {blas.blas_info().version}, core {core}; library micro-kernel {kernel};"
        f" {args.threads} threads; {'process CPU time' if args.cpu_time else 'wall clock'}",
        "GFLOP/s per call, median (fastest): blas = per-tile OpenBLAS in the anchor, library = contraction "
        "library; alone = OpenBLAS (same threads) on the bare GEMM; %peak = library / ISA FMA peak",
    ]
    if args.models:
        header[1] = f"OpenBLAS {blas.blas_info().version}, core {core}; library micro-kernel {kernel}"
        header[2] = (
            f"whole models, {args.threads} threads, wall clock, runs interleaved"
            if args.wall
            else "whole fused models, 1 thread, fastest process CPU time per kernel, modes interleaved"
        )
    if args.layers and args.scaling:
        header[2] = (
            f"{args.layers} anchors, 1 thread (process CPU time) and {args.threads} (wall clock), ours vs "
            f"onnxruntime ORT_ENABLE_ALL (its profiler), fastest of {args.reps} runs per kernel; x = the "
            f"speedup from one thread; lost ms = ours at {args.threads} - ours at 1 / {args.threads}, "
            "less onnxruntime's"
        )
    elif args.layers:
        clock = "process CPU time" if args.threads == 1 else "wall clock"
        header[2] = (
            f"{args.layers} anchors vs onnxruntime ORT_ENABLE_ALL nodes, {args.threads} thread(s), "
            f"fastest of {args.reps} runs per kernel ({clock}; "
            "onnxruntime and OpenVINO: their profilers); %peak = ours / ISA FMA peak on those threads"
        )
    print("\n".join(header), file=sys.stderr if args.json else None)
    if args.layers:
        from graph_autofusion import zoo

        source = zoo.build(args.layers)
        feeds = zoo.example_inputs(source)
        if args.scaling:
            one = compare_layers(source, feeds, 1, args.reps)
            many = compare_layers(source, feeds, args.threads, args.reps)
            if args.json:
                print(json.dumps({"host": header[0], "one_thread": one, "threads": many}, indent=1))
            else:
                print("\n".join(_scaling_lines(one, many, args.threads)))
            return
        layer_rows = compare_layers(source, feeds, args.threads, args.reps)
        if args.json:
            print(json.dumps({"host": header[0], "layers": layer_rows}, indent=1))
        else:
            print("\n".join(_layer_lines(layer_rows, args.threads)))
        return
    if args.models:
        names = [m.strip() for m in args.models.split(",")]
        rows = (
            compare_models_wall(names, args.threads, args.reps)
            if args.wall
            else compare_models(names, args.reps)
        )
        if args.json:
            print(json.dumps({"host": header[0], "openblas_core": core, "models": rows}, indent=1))
        return
    if not args.json:
        cols = f"{'blas':>15}  {'library':>15}  {'ratio':>6}  {'alone':>7}  %peak"
        print(f"{'shape':<28} {'M':>5} {'N':>6} {'K':>5}  {cols}")
    rows, peak = measure(shapes, args.threads, args.reps)
    if args.json:
        print(json.dumps({"host": header[0], "openblas_core": core, "peak_gflops": peak,
                          "rows": [asdict(r) for r in rows]}, indent=1))  # fmt: skip
    else:
        print(f"ISA FMA peak on {args.threads} threads: {peak:.1f} GFLOP/s")


if __name__ == "__main__":
    main()
