"""benchmarks/gpu_speed.py without a GPU: its arguments, its refusal, the torch graph it measures
torch eager and torch.compile on (checked against onnxruntime), the fp16 conversion, the launch
count of the fused model, the table, and a whole run in Triton's CPU interpreter at tiny size."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

# Kernels run in Triton's interpreter here; Triton decides that when it is first imported.
os.environ["TRITON_INTERPRET"] = "1"
torch = pytest.importorskip("torch", reason="the benchmark runs torch (dev extra)")
pytest.importorskip("triton", reason="the fused kernels are Triton's (dev extra)")

import graph_autofusion as gaf  # noqa: E402
from graph_autofusion import zoo  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import gpu_speed  # noqa: E402


def test_arguments_default_to_the_whole_zoo_at_batch_1_and_32_in_fp32_and_fp16() -> None:
    args = gpu_speed.parse_args([])
    assert args.models == gpu_speed.MODELS == sorted(zoo.MODELS, key=gpu_speed.MODELS.index)
    assert args.batches == [1, 32] and args.dtypes == ["fp32", "fp16"] and not args.interpret
    args = gpu_speed.parse_args(["--models", "mlp,gpt2", "--batches", "4", "--dtypes", "fp16"])
    assert args.models == ["mlp", "gpt2"] and args.batches == [4] and args.dtypes == ["fp16"]


@pytest.mark.parametrize(
    "argv",
    [["--models", "alexnet"], ["--dtypes", "int4"], ["--batches", "0"], ["--batches", "x"], ["--reps", "0"]],
)
def test_bad_arguments_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        gpu_speed.parse_args(argv)
    assert caught.value.code == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: the benchmark would run")
def test_without_a_gpu_the_script_refuses_and_says_why() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu_speed.py"), "--models", "mlp"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == gpu_speed.EXIT_NO_GPU, done.stderr
    assert done.stderr.strip().startswith("gpu_speed.py: needs an NVIDIA GPU")
    assert "--interpret" in done.stderr and "Traceback" not in done.stderr and done.stdout == ""


@pytest.mark.parametrize("name", sorted(zoo.MODELS))
def test_the_torch_graph_computes_what_onnxruntime_computes(name: str) -> None:
    """torch eager and torch.compile are measured on `TorchGraph`: it must be the same model."""
    fused = gaf.fuse(zoo.build(name, **zoo.TINY[name]))
    feeds = gpu_speed.host_inputs(fused.canonical, fused.canonical, "fp32")
    graph = gpu_speed.TorchGraph(fused.canonical, "cpu")
    got = graph.run(feeds)
    session = ort.InferenceSession(fused.canonical.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(graph.outputs, feeds)
    assert gpu_speed.relative_error(got, want) < 1e-4, name


def test_fp16_models_keep_integer_inputs_and_agree_with_fp32() -> None:
    source = zoo.build("bert_base", **zoo.TINY["bert_base"])
    half = gpu_speed.to_fp16(source)
    onnx.checker.check_model(half)
    types = {i.name: i.type.tensor_type.elem_type for i in half.graph.input}
    assert set(types.values()) == {onnx.TensorProto.INT64}  # ids and mask stay integers
    assert {t.data_type for t in half.graph.initializer} - {onnx.TensorProto.INT64} == {
        onnx.TensorProto.FLOAT16
    }
    out = half.graph.output[0].type.tensor_type.elem_type
    assert out == onnx.TensorProto.FLOAT16
    full, short = gaf.fuse(source), gaf.fuse(half)
    feeds = gpu_speed.host_inputs(full.canonical, source, "fp32")
    want = gpu_speed.TorchGraph(full.canonical, "cpu").run(feeds)
    got = gpu_speed.TorchGraph(short.canonical, "cpu").run(
        gpu_speed.host_inputs(short.canonical, half, "fp16")
    )
    assert got[0].dtype == np.float16
    assert gpu_speed.relative_error(got, want) < 2e-2


def test_fused_launches_count_every_launch_of_every_kernel_step() -> None:
    # mlp's two linear layers are one anchor chain: one kernel in the plan, launched as two
    # contractions (chains.py), plus the softmax row kernel.
    fused = gaf.fuse(zoo.build("mlp", **zoo.TINY["mlp"]))
    compiled = fused.compile(target="cuda")
    launches, host_ops = gpu_speed.fused_launches(compiled)
    assert host_ops == 0 and launches == 3 and launches > fused.get_kernel_count() == 2
    # Planned for the GPU: no chains and no row stages, so one launch per kernel.
    resnet = gaf.fuse(zoo.build("resnet50", **zoo.TINY["resnet50"]), {"hardware": "cuda"})
    launches, _ = gpu_speed.fused_launches(resnet.compile(target="cuda"))
    assert launches == resnet.get_kernel_count()
    # Planned for the CPU, the classifier's pool joins its Gemm as a prologue, which the Triton
    # runtime launches as the pool's kernel and the contraction.
    cpu_planned = gaf.fuse(zoo.build("resnet50", **zoo.TINY["resnet50"]))
    launches, _ = gpu_speed.fused_launches(cpu_planned.compile(target="cuda"))
    assert launches == cpu_planned.get_kernel_count() + 1


def test_the_table_lines_up_and_shows_what_was_not_measured() -> None:
    rows = [
        gpu_speed.Row(
            "resnet50", 32, "fp16", {"fused": 2.0, "eager": 8.0, "compile": 2.5}, {"fused": 60}, 0, 1e-3
        ),
        gpu_speed.Row("mlp", 1, "fp32", note="failed: boom"),
    ]
    text = gpu_speed.format_table(rows, "# host")
    lines = text.splitlines()
    assert lines[0] == "# host" and len(lines) == 4
    head = lines[1].split()
    assert head[:3] == ["model", "batch", "dtype"] and "launches" in head
    first = lines[2].split()
    assert first[:3] == ["resnet50", "32", "fp16"] and "0.25" in first and "0.80" in first and "60" in first
    assert "-" in first  # no onnxruntime CUDA figure
    assert lines[3].split()[:3] == ["mlp", "1", "fp32"] and lines[3].endswith("failed: boom")


def test_a_whole_run_in_the_interpreter_prints_a_row_per_case(capsys: pytest.CaptureFixture[str]) -> None:
    code = gpu_speed.main(
        ["--interpret", "--small", "--models", "mlp", "--batches", "1,2", "--dtypes", "fp32", "--reps", "1"]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].startswith("# Triton interpreter on the CPU")
    rows = [line.split() for line in lines[2:]]
    assert [r[:3] for r in rows] == [["mlp", "1", "fp32"], ["mlp", "2", "fp32"]]
    for r in rows:
        assert r[7] == "3" and float(r[3]) > 0 and float(r[4]) > 0  # fused launches, fused/eager ms
        assert float(r[-1]) < 1e-4  # fused outputs agree with torch eager


def test_torch_compile_sees_each_zoo_model_as_one_graph() -> None:
    """The torch.compile column is Inductor on the whole model: dynamo captures TorchGraph's call
    as one graph, with no break that would leave ops to eager mode."""
    for name in sorted(zoo.MODELS):
        fused = gaf.fuse(zoo.build(name, **zoo.TINY[name]))
        graph = gpu_speed.TorchGraph(fused.canonical, "cpu")
        args = graph.to_device(gpu_speed.host_inputs(fused.canonical, fused.canonical, "fp32"))
        explained = torch._dynamo.explain(graph.__call__)(*args)
        assert (explained.graph_count, explained.graph_break_count) == (1, 0), (name, explained.break_reasons)
