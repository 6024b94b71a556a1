"""GPU speed on the zoo: our fused Triton kernels (`compile(target="cuda")`) against torch eager,
torch.compile (Inductor) and onnxruntime's CUDA provider (when `onnxruntime-gpu` is installed),
at batch 1 and 32, fp32 and fp16, with the kernel launches each makes per forward.

Every contender runs the same computation: the fused model's canonical ONNX graph (BatchNorm
folded, shape chains constant) is what torch runs — op by op in eager mode (`TorchGraph`, one torch
call per ONNX node), and traced by torch.compile, whose Inductor fuses it with its own Triton
kernels; onnxruntime runs the source model (ORT_ENABLE_ALL, CUDA provider). fp16 models are the
fp32 ones with every float tensor in fp16 (`to_fp16`). Each contender takes host (numpy) inputs
and returns host outputs, so every latency includes the same two copies; the figure is the median
of `--reps` timed calls after warm-up (the fused model tunes its block sizes during warm-up).

Launches per forward are counted by the CUDA profiler (kernels only, copies not counted), for
every contender alike; the fused model's own count (`fused_launches`: one per launch of each
Triton kernel, from its stats) is printed beside it, with its host ops, which run on the CPU. `err`
is the largest difference of the fused outputs from torch eager's, relative to the largest
magnitude of torch eager's.

Run on a host with an NVIDIA GPU (`./run install --extra cuda`):

    .venv/bin/python benchmarks/gpu_speed.py [--models resnet50,bert_base] [--batches 1,32]
        [--dtypes fp32,fp16] [--reps 50] [--small] [--json]

Without a GPU it refuses (exit status 3) and says why. `--interpret` runs the fused kernels in
Triton's CPU interpreter and torch eager on the CPU (no torch.compile, no onnxruntime CUDA): a
check of the script itself, which is what tests/benchmarks/test_gpu_speed.py runs; its timings mean
nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

MODELS = ["resnet50", "mobilenet_v2", "bert_base", "gpt2", "vit_b16", "mlp"]
DTYPES = ("fp32", "fp16")
#: Variants small enough for a quick run of the script (`--small`); the batch comes from --batches.
SMALL: dict[str, dict[str, Any]] = {
    "resnet50": {"image_size": 64, "width": 16, "layers": (1, 1, 1, 1), "num_classes": 10},
    "mobilenet_v2": {"image_size": 64, "width_mult": 0.5, "num_classes": 10},
    "bert_base": {"num_layers": 2, "hidden": 128, "heads": 2, "seq_len": 32, "vocab": 500},
    "gpt2": {"num_layers": 2, "hidden": 128, "heads": 2, "seq_len": 32, "vocab": 500, "max_positions": 64},
    "vit_b16": {"image_size": 64, "patch": 16, "num_layers": 2, "hidden": 128, "heads": 2, "num_classes": 10},
    "mlp": {},
}
#: Exit status when no GPU is there to measure on.
EXIT_NO_GPU = 3


class NoGpu(Exception):
    """There is no CUDA device to measure on; the message says what is missing."""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog="gpu_speed.py")
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated zoo models")
    p.add_argument("--batches", default="1,32", help="comma-separated batch sizes (default 1,32)")
    p.add_argument("--dtypes", default="fp32,fp16", help="comma-separated: fp32, fp16")
    p.add_argument("--reps", type=int, default=50, help="timed calls per contender (median)")
    p.add_argument("--warmup", type=int, default=5, help="untimed calls first (tuning, compiling)")
    p.add_argument("--small", action="store_true", help="small variants of the models")
    p.add_argument("--json", action="store_true", help="one JSON object per row")
    p.add_argument(
        "--interpret",
        action="store_true",
        help="no GPU: fused kernels in Triton's CPU interpreter, torch eager on the CPU (checks the script)",
    )
    args = p.parse_args(argv)
    args.models = _names(args.models, MODELS, "model", p)
    args.dtypes = _names(args.dtypes, list(DTYPES), "dtype", p)
    try:
        args.batches = [int(b) for b in args.batches.split(",") if b.strip()]
    except ValueError:
        p.error(f"--batches: not a list of integers: {args.batches!r}")
    if not args.batches or min(args.batches) < 1:
        p.error("--batches: give positive batch sizes")
    if args.reps < 1 or args.warmup < 0:
        p.error("--reps must be ≥ 1 and --warmup ≥ 0")
    return args


def _names(value: str, known: list[str], what: str, p: argparse.ArgumentParser) -> list[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        p.error(f"unknown {what}(s) {unknown or value!r}; known: {', '.join(known)}")
    return names


def require_gpu() -> str:
    """The CUDA device's name, or `NoGpu` saying what is missing."""
    try:
        import torch
        import triton  # noqa: F401
    except ImportError as exc:
        raise NoGpu(f"needs torch and triton (./run install --extra cuda): {exc}") from None
    if not torch.cuda.is_available():
        raise NoGpu(
            "needs an NVIDIA GPU, and torch.cuda.is_available() is False (no GPU, no driver, or a "
            "CPU-only torch); --interpret checks the script on the CPU, without meaningful timings"
        )
    major, minor = torch.cuda.get_device_capability(0)
    return f"{torch.cuda.get_device_name(0)} (sm_{major}{minor})"


# -- models ---------------------------------------------------------------------------------------
def build(name: str, batch: int, small: bool) -> onnx.ModelProto:
    from graph_autofusion import zoo

    return zoo.build(name, batch=batch, **(SMALL[name] if small else {}))


def to_fp16(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with every fp32 tensor in fp16: initializers, Constant values, Casts to float, and
    the declared types of inputs, outputs and intermediates. Integer tensors (ids, shapes) stay."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    f32, f16 = onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16

    def half(tensor: onnx.TensorProto) -> onnx.TensorProto:
        if tensor.data_type != f32:
            return tensor
        return numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float16), tensor.name)

    for k, init in enumerate(graph.initializer):
        graph.initializer[k].CopyFrom(half(init))
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                attr.t.CopyFrom(half(attr.t))
            elif node.op_type == "Cast" and attr.name == "to" and attr.i == f32:
                attr.i = f16
    for value in (*graph.input, *graph.output, *graph.value_info):
        if value.type.tensor_type.elem_type == f32:
            value.type.tensor_type.elem_type = f16
    return out


def host_inputs(model: onnx.ModelProto, source: onnx.ModelProto, dtype: str) -> dict[str, np.ndarray]:
    """The zoo's example inputs for `source`, float ones in `dtype`."""
    from graph_autofusion import zoo

    feeds = zoo.example_inputs(source)
    if dtype == "fp16":
        feeds = {k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in feeds.items()}
    names = [i.name for i in model.graph.input]
    return {k: feeds[k] for k in names}


# -- torch: the canonical graph, one torch call per ONNX node --------------------------------------
class TorchGraph:
    """An ONNX graph run with torch ops on `device`: torch eager's version of the model, and what
    torch.compile traces. Covers the ops of the zoo's canonical graphs; others raise."""

    def __init__(self, model: onnx.ModelProto, device: str) -> None:
        import torch

        self.torch = torch
        self.device = device
        arrays = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        self.weights = {k: self._tensor(v) for k, v in arrays.items()}
        # Shapes, axes and bounds as Python values: torch.compile then sees constants, not numpy.
        self.consts: dict[str, Any] = {k: v.tolist() for k, v in arrays.items() if v.size <= 64}
        self.inputs = [i.name for i in model.graph.input if i.name not in arrays]
        self.outputs = [o.name for o in model.graph.output]
        unknown = sorted({n.op_type for n in model.graph.node if not hasattr(self, f"op_{n.op_type}")})
        if unknown:
            raise NotImplementedError(f"TorchGraph has no rule for {', '.join(unknown)}")
        # The plan in plain Python values, read once: what torch.compile traces is then only dict
        # look-ups and torch calls, never the protobuf objects.
        self.plan: list[tuple[Callable[..., Any], tuple[str, ...], tuple[str, ...], dict[str, Any]]] = []
        for node in model.graph.node:
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            if node.op_type == "Cast":
                np_type = onnx.helper.tensor_dtype_to_np_dtype(attrs["to"])
                attrs["to"] = torch.from_numpy(np.zeros(1, np_type)).dtype
            method = getattr(self, f"op_{node.op_type}")
            self.plan.append((method, tuple(node.input), tuple(node.output), attrs))

    def _tensor(self, array: np.ndarray) -> Any:
        return self.torch.from_numpy(np.ascontiguousarray(array).copy()).to(self.device)

    def to_device(self, feeds: Mapping[str, np.ndarray]) -> list[Any]:
        return [self._tensor(feeds[name]) for name in self.inputs]

    def __call__(self, *args: Any) -> list[Any]:
        values: dict[str, Any] = {**self.weights, **dict(zip(self.inputs, args, strict=True))}
        for method, inputs, outputs, attrs in self.plan:
            result = method(inputs, [values[n] if n else None for n in inputs], attrs)
            results = result if isinstance(result, tuple) else (result,)
            for name, value in zip(outputs, results, strict=False):
                if name:
                    values[name] = value
        return [values[n] for n in self.outputs]

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Host arrays in, host arrays out (what every contender is timed on)."""
        return [t.detach().cpu().numpy() for t in self(*self.to_device(feeds))]

    def const(self, names: tuple[str, ...], k: int) -> Any:
        """Input `k` (of a node's input `names`) as a constant (shapes, axes, bounds); None when absent."""
        if len(names) <= k or not names[k]:
            return None
        return self.consts[names[k]]

    # elementwise
    def op_Add(self, n: Any, i: list[Any], a: dict) -> Any:
        return i[0] + i[1]

    def op_Sub(self, n: Any, i: list[Any], a: dict) -> Any:
        return i[0] - i[1]

    def op_Mul(self, n: Any, i: list[Any], a: dict) -> Any:
        return i[0] * i[1]

    def op_Div(self, n: Any, i: list[Any], a: dict) -> Any:
        if not i[0].is_floating_point():
            return self.torch.div(i[0], i[1], rounding_mode="trunc")
        return i[0] / i[1]

    def op_Pow(self, n: Any, i: list[Any], a: dict) -> Any:
        return self.torch.pow(i[0], i[1])

    def op_Relu(self, n: Any, i: list[Any], a: dict) -> Any:
        return self.torch.relu(i[0])

    def op_Tanh(self, n: Any, i: list[Any], a: dict) -> Any:
        return self.torch.tanh(i[0])

    def op_Erf(self, n: Any, i: list[Any], a: dict) -> Any:
        return self.torch.erf(i[0])

    def op_Where(self, n: Any, i: list[Any], a: dict) -> Any:
        return self.torch.where(i[0], i[1], i[2])

    def op_Cast(self, n: Any, i: list[Any], a: dict) -> Any:
        return i[0].to(a["to"])

    def op_Clip(self, n: Any, i: list[Any], a: dict) -> Any:
        low, high = self.const(n, 1), self.const(n, 2)
        return self.torch.clamp(
            i[0], min=None if low is None else float(low), max=None if high is None else float(high)
        )

    # layout
    def op_Reshape(self, n: Any, i: list[Any], a: dict) -> Any:
        shape = [int(s) for s in self.const(n, 1)]
        if not a.get("allowzero", 0):
            shape = [i[0].shape[k] if s == 0 else s for k, s in enumerate(shape)]
        return i[0].reshape(shape)

    def op_Flatten(self, n: Any, i: list[Any], a: dict) -> Any:
        axis = a.get("axis", 1) % max(i[0].dim(), 1)
        return i[0].reshape(math.prod(i[0].shape[:axis]), -1)

    def op_Squeeze(self, n: Any, i: list[Any], a: dict) -> Any:
        axes = self.const(n, 1) if len(n) > 1 else a.get("axes")
        if axes is None:
            return i[0].squeeze()
        axes = axes if isinstance(axes, list) else [axes]
        return i[0].squeeze(tuple(int(x) % i[0].dim() for x in axes))

    def op_Transpose(self, n: Any, i: list[Any], a: dict) -> Any:
        perm = a.get("perm") or list(range(i[0].dim()))[::-1]
        return i[0].permute(*perm)

    def op_Concat(self, n: Any, i: list[Any], a: dict) -> Any:
        return self.torch.cat([x for x in i if x is not None], dim=a["axis"])

    def op_Slice(self, n: Any, i: list[Any], a: dict) -> Any:
        starts, ends = self.const(n, 1), self.const(n, 2)
        axes = self.const(n, 3)
        steps = self.const(n, 4)
        x = i[0]
        index: list[slice] = [slice(None)] * x.dim()
        for k, axis in enumerate(range(len(starts)) if axes is None else axes):
            step = 1 if steps is None else int(steps[k])
            if step != 1:
                raise NotImplementedError("Slice with steps")
            dim = x.shape[int(axis)]
            start, end = min(max(int(starts[k]), -dim), dim), min(max(int(ends[k]), -dim - 1), dim)
            index[int(axis)] = slice(start, end)
        return x[tuple(index)]

    def op_Gather(self, n: Any, i: list[Any], a: dict) -> Any:
        axis = a.get("axis", 0) % i[0].dim()
        idx = i[1].long()
        idx = self.torch.where(idx < 0, idx + i[0].shape[axis], idx)
        picked = i[0].index_select(axis, idx.reshape(-1))
        shape = (*i[0].shape[:axis], *idx.shape, *i[0].shape[axis + 1 :])
        return picked.reshape(shape)

    # contractions, reductions, normalization
    def op_MatMul(self, n: Any, i: list[Any], a: dict) -> Any:
        return self.torch.matmul(i[0], i[1])

    def op_Gemm(self, n: Any, i: list[Any], a: dict) -> Any:
        x = i[0].t() if a.get("transA", 0) else i[0]
        w = i[1].t() if a.get("transB", 0) else i[1]
        y = a.get("alpha", 1.0) * (x @ w)
        if len(i) > 2 and i[2] is not None:
            y = y + a.get("beta", 1.0) * i[2]
        return y

    def op_Conv(self, n: Any, i: list[Any], a: dict) -> Any:
        import torch.nn.functional as F

        if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
            raise NotImplementedError("Conv auto_pad")
        spatial = i[1].dim() - 2
        pads = list(a.get("pads", [0] * 2 * spatial))
        x, padding = i[0], pads[:spatial]
        if pads[:spatial] != pads[spatial:]:
            x, padding = F.pad(x, _torch_pad(pads, spatial)), [0] * spatial
        return F.conv2d(
            x,
            i[1],
            i[2] if len(i) > 2 else None,
            stride=a.get("strides", [1] * spatial),
            padding=padding,
            dilation=a.get("dilations", [1] * spatial),
            groups=a.get("group", 1),
        )

    def op_MaxPool(self, n: Any, i: list[Any], a: dict) -> Any:
        import torch.nn.functional as F

        kernel = a["kernel_shape"]
        spatial = len(kernel)
        pads = list(a.get("pads", [0] * 2 * spatial))
        x, padding = i[0], pads[:spatial]
        if pads[:spatial] != pads[spatial:]:
            x, padding = F.pad(x, _torch_pad(pads, spatial), value=float("-inf")), [0] * spatial
        return F.max_pool2d(
            x,
            kernel,
            stride=a.get("strides", [1] * spatial),
            padding=padding,
            dilation=a.get("dilations", [1] * spatial),
            ceil_mode=bool(a.get("ceil_mode", 0)),
        )

    def op_GlobalAveragePool(self, n: Any, i: list[Any], a: dict) -> Any:
        return i[0].mean(dim=tuple(range(2, i[0].dim())), keepdim=True)

    def op_Softmax(self, n: Any, i: list[Any], a: dict) -> Any:
        return self.torch.softmax(i[0], dim=a.get("axis", -1))

    def op_LayerNormalization(self, n: Any, i: list[Any], a: dict) -> Any:
        import torch.nn.functional as F

        axis = a.get("axis", -1) % i[0].dim()
        shape = tuple(i[0].shape[axis:])
        bias = i[2] if len(i) > 2 else None
        return F.layer_norm(i[0], shape, i[1], bias, a.get("epsilon", 1e-5))


def _torch_pad(pads: list[int], spatial: int) -> list[int]:
    """ONNX pads (begins, then ends, outermost axis first) as F.pad's (last axis first)."""
    out: list[int] = []
    for axis in reversed(range(spatial)):
        out += [pads[axis], pads[axis + spatial]]
    return out


# -- measuring ------------------------------------------------------------------------------------
def fused_launches(compiled: Any) -> tuple[int, int]:
    """Kernel launches per forward of a Triton-compiled model, from its stats (one per launch of
    every kernel step), and the host ops it runs on the CPU."""
    stats = compiled.stats
    return sum(int(k["launches"]) for k in stats["per_kernel"]), len(stats["host_ops"])


def cuda_launches(run: Callable[[], Any]) -> int:
    """CUDA kernels one call of `run` launches, as the profiler records them (copies excluded)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    return count_kernels(prof.events())


def count_kernels(events: Any) -> int:
    """Device events that are kernels: not memory copies or sets."""
    from torch.autograd import DeviceType

    return sum(
        1
        for e in events
        if e.device_type == DeviceType.CUDA and not e.name.lower().startswith(("memcpy", "memset"))
    )


def median_ms(run: Callable[[], Any], reps: int, warmup: int, sync: Callable[[], None]) -> float:
    for _ in range(warmup):
        run()
    sync()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        run()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def relative_error(got: Sequence[np.ndarray], want: Sequence[np.ndarray]) -> float:
    worst = 0.0
    for g, w in zip(got, want, strict=True):
        w64, g64 = np.asarray(w, np.float64), np.asarray(g, np.float64)
        scale = max(float(np.abs(w64).max(initial=0.0)), 1e-30)
        worst = max(worst, float(np.abs(g64 - w64).max(initial=0.0)) / scale)
    return worst


@dataclass
class Row:
    model: str
    batch: int
    dtype: str
    ms: dict[str, float | None] = field(default_factory=dict)
    launches: dict[str, int | None] = field(default_factory=dict)
    host_ops: int | None = None
    err: float | None = None
    note: str = ""


CONTENDERS = ("fused", "eager", "compile", "ort_cuda")


def format_table(rows: Sequence[Row], header: str = "") -> str:
    """A fixed-width table: latency (ms) and launches per forward of each contender."""
    cols = ["model", "batch", "dtype"]
    cols += [f"{c} ms" for c in CONTENDERS]
    cols += [f"{c} launches" for c in CONTENDERS]
    cols += ["host ops", "fused/eager", "fused/compile", "err", "note"]
    lines = []
    for r in rows:
        ms, la = r.ms, r.launches
        cells = [r.model, str(r.batch), r.dtype]
        cells += [_num(ms.get(c)) for c in CONTENDERS]
        cells += [_int(la.get(c)) for c in CONTENDERS]
        cells += [_int(r.host_ops), _ratio(ms.get("fused"), ms.get("eager"))]
        cells += [_ratio(ms.get("fused"), ms.get("compile"))]
        cells += ["-" if r.err is None else f"{r.err:.1e}", r.note]
        lines.append(cells)
    widths = [max(len(h), *(len(c[k]) for c in lines)) if lines else len(h) for k, h in enumerate(cols)]
    out = [header] if header else []
    out.append("  ".join(h.rjust(w) for h, w in zip(cols, widths, strict=True)).rstrip())
    out += ["  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True)).rstrip() for cells in lines]
    return "\n".join(out)


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def _int(v: int | None) -> str:
    return "-" if v is None else str(v)


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None or b <= 0 else f"{a / b:.2f}"


def run_case(name: str, batch: int, dtype: str, args: argparse.Namespace) -> Row:
    """Measure one (model, batch, dtype): every contender that can run here."""
    import torch

    import graph_autofusion as gaf

    row = Row(name, batch, dtype)
    source = build(name, batch, args.small)
    if dtype == "fp16":
        source = to_fp16(source)
    fused = gaf.fuse(source, {"hardware": "cuda"})  # planned for the GPU's profile
    feeds = host_inputs(fused.canonical, source, dtype)
    device = "cpu" if args.interpret else "cuda"
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    gpu = device == "cuda"

    compiled = fused.compile(target="cuda")
    fused_run = lambda: compiled.run(feeds)  # noqa: E731
    row.launches["fused"], row.host_ops = fused_launches(compiled)
    row.ms["fused"] = median_ms(fused_run, args.reps, args.warmup, sync)
    if gpu:
        row.launches["fused"] = cuda_launches(fused_run)

    eager = TorchGraph(fused.canonical, device)
    want = eager.run(feeds)
    got = fused_run()
    row.err = relative_error([got[n] for n in eager.outputs], want)
    row.ms["eager"] = median_ms(lambda: eager.run(feeds), args.reps, args.warmup, sync)
    if gpu:
        row.launches["eager"] = cuda_launches(lambda: eager.run(feeds))
        try:
            traced = torch.compile(eager.__call__, dynamic=False)  # Inductor, default mode
            compiled_run = lambda: [t.cpu().numpy() for t in traced(*eager.to_device(feeds))]  # noqa: E731
            row.ms["compile"] = median_ms(compiled_run, args.reps, max(args.warmup, 3), sync)
            row.launches["compile"] = cuda_launches(compiled_run)
        except Exception as exc:  # Inductor failing on a graph is a finding, not a crash
            row.note += f"torch.compile: {type(exc).__name__}; "
        ort_run = _ort_cuda(source, feeds)
        if ort_run is not None:
            row.ms["ort_cuda"] = median_ms(ort_run, args.reps, args.warmup, sync)
            row.launches["ort_cuda"] = cuda_launches(ort_run)
        else:
            row.note += "no onnxruntime CUDA provider; "
    row.note = row.note.strip().rstrip(";")
    return row


def _ort_cuda(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> Callable[[], Any] | None:
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return None
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CUDAExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    inputs = {k: v for k, v in feeds.items() if k in names}
    return lambda: session.run(None, inputs)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (docs/targets.md)
        where = "Triton interpreter on the CPU (timings mean nothing)"
    else:
        try:
            where = require_gpu()
        except NoGpu as exc:
            print(f"gpu_speed.py: {exc}", file=sys.stderr)
            return EXIT_NO_GPU
    import torch
    import triton

    header = f"# {where}; torch {torch.__version__}, triton {triton.__version__}; reps {args.reps}"
    print(header, file=sys.stderr if args.json else sys.stdout, flush=True)
    rows = []
    for name in args.models:
        for batch in args.batches:
            for dtype in args.dtypes:
                try:
                    row = run_case(name, batch, dtype, args)
                except Exception as exc:
                    row = Row(name, batch, dtype, note=f"failed: {type(exc).__name__}: {exc}"[:200])
                rows.append(row)
                if args.json:
                    print(json.dumps({**asdict(row), "host": where}), flush=True)
    if not args.json:
        print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
