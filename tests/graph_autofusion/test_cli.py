"""`autofusion fuse` end to end in a subprocess: table, files, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import onnx

import graph_autofusion as gaf


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
        "verification  passed",
    ):
        assert row in done.stdout
    report = json.loads(rep.read_text())
    assert report["strategy"] == "latency" and report["verification"]["passed"]
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
