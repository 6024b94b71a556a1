"""The remote CLI: argument handling, exit codes, progress output; live runs against the service."""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from graph_autofusion_client import JobState
from graph_autofusion_client._console import ProgressPrinter, render_table, statistics_rows
from graph_autofusion_client._job import _JobView
from graph_autofusion_client.cli import add_commands, main

from ._fakes import job_json
from ._live import LiveService, free_port, service_available
from ._onnx_models import symbolic_batch, tiny_mlp

live = pytest.mark.skipif(not service_available(), reason="autofusion_service is not installed")


def test_add_commands_registers_on_a_foreign_parser() -> None:
    parser = argparse.ArgumentParser(prog="autofusion")
    subparsers = parser.add_subparsers(dest="command")
    subparsers.add_parser("fuse")  # the engine's own commands live beside ours
    add_commands(subparsers)
    args = parser.parse_args(["submit", "m.onnx", "--server", "http://x", "--wait", "--out", "f.onnx"])
    assert (args.command, args.model, args.out, args.wait) == ("submit", Path("m.onnx"), Path("f.onnx"), True)
    assert callable(args.func)
    assert callable(parser.parse_args(["status", "job-1"]).func)
    assert callable(parser.parse_args(["report", "job-1"]).func)


def test_help_documents_exit_codes() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "graph_autofusion_client.cli", "submit", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    for line in (
        "2  invalid input",
        "3  the job failed",
        "4  the service is unreachable",
        "5  authentication",
    ):
        assert line in result.stdout


def test_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "m.onnx"
    model.write_bytes(b"x")
    assert main(["submit", str(tmp_path / "missing.onnx"), "--server", "http://127.0.0.1:9"]) == 2
    assert "model file not found" in capsys.readouterr().err
    bad = tmp_path / "cfg.json"
    bad.write_text("{not json")
    assert main(["submit", str(model), "--server", "http://127.0.0.1:9", "--config", str(bad)]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    bad.write_text("[1, 2]")
    assert main(["submit", str(model), "--server", "http://127.0.0.1:9", "--config", str(bad)]) == 2
    with pytest.raises(SystemExit) as info:
        main(["submit"])
    assert info.value.code == 2


def test_no_server_configured_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("AUTOFUSION_URL", raising=False)
    model = tmp_path / "m.onnx"
    model.write_bytes(b"x")
    assert main(["submit", str(model)]) == 2
    assert "AUTOFUSION_URL" in capsys.readouterr().err


def test_unreachable_exits_4(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "m.onnx"
    model.write_bytes(b"x")
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["submit", str(model), "--server", url, "--retries", "1"]) == 4
    assert "service unreachable" in capsys.readouterr().err


def _view(**fields: object) -> _JobView:
    return _JobView(JobState.model_validate(job_json(**fields)))


def test_progress_on_a_tty_redraws_one_line() -> None:
    stream = io.StringIO()
    printer = ProgressPrinter(stream, tty=True)
    printer(_view(status="running", stage="compiling", progress={"done": 3, "total": 4}))
    printer(_view(status="succeeded", stage="packaging"))
    printer.close()
    out = stream.getvalue()
    assert out.count("\r\x1b[2K") == 2 and out.endswith("\n") and out.count("\n") == 1
    assert "[" + "#" * 18 + "." * 6 + "]" in out and "3/4 kernels" in out


def test_progress_without_a_tty_prints_plain_lines() -> None:
    stream = io.StringIO()
    printer = ProgressPrinter(stream, tty=False)
    printer(_view(status="queued"))
    printer(_view(status="running", stage="compiling", progress={"done": 1, "total": 2}))
    printer.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and "\r" not in stream.getvalue()
    assert lines[1].endswith("job-1  running  compiling  1/2 kernels")


def test_statistics_table() -> None:
    from graph_autofusion_client import Report

    report = Report.model_validate(
        {
            "operators": {"original": 9, "canonical": 8},
            "kernels": {"before": 8, "after": 3},
            "fusions": 2,
            "refused": [{"code": "NF003"}],
            "estimates": {"profile": "cpu", "latency_us": {"before": 10.0, "after": 4.0}},
            "strategy": "latency",
        }
    )
    rows = dict(statistics_rows(_view(status="succeeded"), report))
    assert rows["operators"] == "9 (canonical 8)"
    assert rows["kernels"] == "8 -> 3"
    assert rows["latency (cpu)"] == "10.0 us -> 4.0 us"
    assert rows["est. speedup"] == "2.50x"
    assert rows["refused"] == "NF003 x1"
    assert "bytes moved" not in rows  # unknown quantities are left out, not shown as "None"
    table = render_table(list(rows.items()))
    assert "est. speedup   2.50x" in table  # names padded to one column


# -- against the live service --------------------------------------------------------------------------


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    path = tmp_path / "mlp.onnx"
    path.write_bytes(tiny_mlp(hidden=10).SerializeToString())
    return path


@pytest.fixture
def env(live_service: LiveService, monkeypatch: pytest.MonkeyPatch) -> LiveService:
    monkeypatch.setenv("AUTOFUSION_URL", live_service.url)
    monkeypatch.setenv("AUTOFUSION_API_KEY", live_service.key)
    return live_service


@live
def test_submit_wait_download_then_status_and_report(
    env: LiveService, model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, bundle = tmp_path / "fused.onnx", tmp_path / "b.tgz"
    code = main(["submit", str(model_file), "--server", env.url, "--out", str(out), "--bundle", str(bundle)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert out.stat().st_size > 0 and bundle.stat().st_size > 0
    assert "kernels" in captured.out and "succeeded" in captured.out
    job_id = next(line.split()[1] for line in captured.out.splitlines() if line.startswith("job "))

    assert main(["status", job_id, "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["id"] == job_id and status["status"] == "succeeded" and "report" in status
    assert main(["report", job_id, "--json"]) == 0
    assert "kernels" in json.loads(capsys.readouterr().out)


@live
def test_submit_without_wait_prints_the_job(env: LiveService, model_file: Path, capsys) -> None:
    assert (
        main(["submit", str(model_file), "--json", "--config", _config(model_file, {"max_rounds": 3})]) == 0
    )
    job = json.loads(capsys.readouterr().out)
    assert job["config"]["max_rounds"] == 3
    assert main(["status", job["id"], "--wait", "--quiet"]) == 0


def _config(beside: Path, config: dict[str, object]) -> str:
    path = beside.parent / "cfg.json"
    path.write_text(json.dumps(config))
    return str(path)


@live
def test_exit_codes_against_the_service(env: LiveService, model_file: Path, tmp_path: Path, capsys) -> None:
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"definitely not onnx")
    assert main(["submit", str(garbage)]) == 2
    assert main(["submit", str(model_file), "--config", _config(model_file, {"max_fusion_size": -3})]) == 2
    assert main(["status", "no-such-job"]) == 2
    assert main(["submit", str(model_file), "--api-key", "wrong"]) == 5
    assert "authentication failed" in capsys.readouterr().err


@live
def test_failed_job_exits_3_with_its_problem(env: LiveService, tmp_path: Path, capsys) -> None:
    model = tmp_path / "symbolic.onnx"
    model.write_bytes(symbolic_batch().SerializeToString())
    out = tmp_path / "fused.onnx"
    assert main(["submit", str(model), "--out", str(out)]) == 3
    captured = capsys.readouterr()
    assert "failed: [unbound_dimension]" in captured.err
    assert "unbound_dimension" in captured.out  # the table shows the error row too
    assert not out.exists()


@live
def test_engine_cli_offers_the_remote_commands(env: LiveService, model_file: Path, capsys) -> None:
    engine_cli = pytest.importorskip("graph_autofusion.cli")
    assert engine_cli.main(["submit", str(model_file), "--server", env.url, "--wait", "--quiet"]) == 0
    assert "kernels" in capsys.readouterr().out


@live
def test_cancelled_job_exits_3(env: LiveService, capsys) -> None:
    from graph_autofusion_client import Client

    with Client() as client:
        job = client.submit(tiny_mlp(hidden=14), config={"max_rounds": 5}).cancel()
    assert main(["status", job.id, "--wait"]) == 3
    assert "cancelled" in capsys.readouterr().err


@live
def test_a_closed_stdout_ends_quietly(env: LiveService, model_file: Path, capsys) -> None:
    """`autofusion report --json | head`: the reader goes away; no traceback, exit 128 + SIGPIPE."""
    assert main(["submit", str(model_file), "--wait"]) == 0
    job_id = next(line.split()[1] for line in capsys.readouterr().out.splitlines() if line.startswith("job "))
    reader, writer = os.pipe()
    os.close(reader)  # the reader is gone before the command writes a byte
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from graph_autofusion_client.cli import main; sys.exit(main(sys.argv[1:]))",
                "report",
                job_id,
                "--json",
            ],
            stdout=writer,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(writer)
    assert done.returncode == 141 and "Traceback" not in done.stderr, done.stderr
