"""`autofusion fuse` end to end in a subprocess: table, files, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import onnx

import graph_autofusion as gaf
from graph_autofusion.backend.cpu.isa import host_isa


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "graph_autofusion.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_fuse_writes_model_and_report(tmp_path: Path) -> None:
    src = tmp_path / "bert.onnx"
    onnx.save(
        gaf.zoo.build("bert_base", num_layers=1, hidden=32, heads=2, seq_len=8, vocab=50, dynamic_batch=True),
        src,
    )
    out, rep = tmp_path / "fused.onnx", tmp_path / "report.json"
    done = run(
        "fuse",
        str(src),
        "-o",
        str(out),
        "--cost-model",
        "latency",
        "--input-shape",
        "input_ids=1,8",
        "--input-shape",
        "attention_mask=1,8",
        "--report",
        str(rep),
    )
    assert done.returncode == 0, done.stderr
    for row in (
        "operators",
        "kernels",
        "fusions",
        "bytes moved",
        "peak memory",
        "latency",
        "hardware",
        "verification  passed",
    ):
        assert row in done.stdout
    report = json.loads(rep.read_text())
    assert report["strategy"] == "latency" and report["verification"]["passed"]
    assert report["hardware"]["isa"] == host_isa().name and report["hardware"]["kernel_isa"]
    assert f"ISA {host_isa().name}" in done.stdout
    onnx.checker.check_model(onnx.load(out), full_check=True)


def test_fuse_bad_input_exits_2_with_the_sentence(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"definitely not a protobuf \xff\xfe")
    done = run("fuse", str(bad))
    assert done.returncode == 2
    assert "not_onnx" in done.stderr and "Traceback" not in done.stderr
    done = run("fuse", str(tmp_path / "missing.onnx"))
    assert done.returncode == 2 and "file_not_found" in done.stderr


def test_unbound_dimension_is_named(tmp_path: Path) -> None:
    src = tmp_path / "m.onnx"
    onnx.save(gaf.zoo.build("mlp", dynamic_batch=True), src)
    done = run("fuse", str(src))
    assert done.returncode == 2 and "unbound_dimension" in done.stderr


def _relu(path: Path) -> Path:
    from onnx import TensorProto
    from onnx import helper as h

    graph = h.make_graph(
        [h.make_node("Relu", ["x"], ["y"])],
        "relu",
        [h.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 1000])],
        [h.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 1000])],
    )
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8), path)
    return path


def test_activations_over_the_limit_exit_2_with_the_tensor_named(tmp_path: Path) -> None:
    src = _relu(tmp_path / "relu.onnx")
    done = run("fuse", str(src), "--input-shape", "x=100000000,1000")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "model_too_large" in done.stderr and "'x' [100000000, 1000] float32" in done.stderr
    done = run("fuse", str(src), "--input-shape", "x=4,1000", "--max-activation-bytes", "16000")
    assert done.returncode == 2 and "32,000 bytes" in done.stderr
    done = run("fuse", str(src), "--input-shape", "x=4,1000", "--max-activation-bytes", "0")
    assert done.returncode == 2 and "invalid_config" in done.stderr and "Traceback" not in done.stderr


def _if_reading_outer_scope(path: Path) -> Path:
    """y = Relu(x); out = If(c, then: y + y, else: y * x) — both branches read y and x by name."""
    from onnx import TensorProto
    from onnx import helper as h

    def branch(op: str, a: str, b: str, out: str) -> onnx.GraphProto:
        value = h.make_tensor_value_info(out, TensorProto.FLOAT, [2, 3])
        return h.make_graph([h.make_node(op, [a, b], [out])], out, [], [value])

    graph = h.make_graph(
        [
            h.make_node("Relu", ["x"], ["y"]),
            h.make_node(
                "If",
                ["c"],
                ["out"],
                name="branch",
                then_branch=branch("Add", "y", "y", "t"),
                else_branch=branch("Mul", "y", "x", "e"),
            ),
        ],
        "if",
        [
            h.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
            h.make_tensor_value_info("c", TensorProto.BOOL, []),
        ],
        [h.make_tensor_value_info("out", TensorProto.FLOAT, [2, 3])],
    )
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8), path)
    return path


def test_control_flow_runs_as_a_listed_host_op_or_is_refused(tmp_path: Path) -> None:
    src = _if_reading_outer_scope(tmp_path / "if.onnx")
    done = run("fuse", str(src))  # verification runs the kernels and the If against onnxruntime
    assert done.returncode == 0, done.stderr
    assert "1 run by onnx.reference: control_flow×1" in done.stdout
    assert "If 'branch' [control_flow]" in done.stdout and "verification  passed" in done.stdout
    assert "out: max abs error" in done.stdout and "x its tolerance" in done.stdout
    done = run("fuse", str(src), "--no-host-ops")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "host_op_refused" in done.stderr and "If 'branch' [control_flow]" in done.stderr


def test_hardware_names_the_host_isa_and_the_kernel_isa() -> None:
    done = run("hardware", "--json")
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert info["isa"] == host_isa().name and info["kernel_isa"] and info["cpu"]
    table = run("hardware")
    assert table.returncode == 0 and host_isa().name in table.stdout and "kernels built for" in table.stdout


def test_load_recompiles_a_bundle_of_another_isa_or_refuses_with_no_recompile(tmp_path: Path) -> None:
    model = gaf.zoo.build("mlp", in_features=16, hidden=(32,), num_classes=4)
    bundle = gaf.fuse(model).save_bundle(tmp_path / "b")
    done = run("load", str(bundle), "--no-recompile", "--run")
    assert done.returncode == 0, done.stderr
    assert "loaded as built" in done.stdout and "ran once" in done.stdout
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest.update(machine="riscv64", isa="riscv64+v")  # a bundle from a host of another kind
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    refused = run("load", str(bundle), "--no-recompile")
    assert refused.returncode == 2 and "[isa_mismatch]" in refused.stderr
    recompiled = run("load", str(bundle), "--run")
    assert recompiled.returncode == 0, recompiled.stderr
    assert "recompiled from" in recompiled.stdout and "ran once" in recompiled.stdout
