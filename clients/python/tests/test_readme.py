"""The README's pipeline example runs as written against a live service."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ._live import LiveService, service_available
from ._onnx_models import tiny_mlp

README = Path(__file__).resolve().parents[1] / "README.md"
MARKER = "<!-- pipeline-example"


def pipeline_example(marker: str = MARKER) -> str:
    text = README.read_text()
    match = re.search(re.escape(marker) + r".*?-->\s*```python\n(.*?)```", text, re.S)
    assert match, f"README lost its marked example {marker!r}"
    return match.group(1)


def test_example_is_ten_lines_of_valid_python() -> None:
    code = pipeline_example()
    assert len(code.strip().splitlines()) <= 10
    compile(code, "README.md", "exec")


@pytest.mark.skipif(not service_available(), reason="autofusion_service is not installed")
def test_pipeline_example_runs_as_written(live_service: LiveService, tmp_path: Path) -> None:
    (tmp_path / "model.onnx").write_bytes(tiny_mlp(hidden=18).SerializeToString())
    (tmp_path / "example.py").write_text(pipeline_example())
    env = {**os.environ, "AUTOFUSION_URL": live_service.url, "AUTOFUSION_API_KEY": live_service.key}
    result = subprocess.run(
        [sys.executable, "example.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 0, result.stderr
    pattern = r"job \S+: \d+ -> \d+ kernels, \d+\.\dx faster\n"
    assert re.fullmatch(pattern, result.stdout), result.stdout
    assert (tmp_path / "fused.onnx").stat().st_size > 0


@pytest.mark.skipif(not service_available(), reason="autofusion_service is not installed")
def test_steps_example_runs_as_written(live_service: LiveService, tmp_path: Path) -> None:
    """The second snippet: submit in one step, pick the job up by its stored id in another."""
    (tmp_path / "model.onnx").write_bytes(tiny_mlp(hidden=19).SerializeToString())
    (tmp_path / "example.py").write_text(pipeline_example("<!-- steps-example"))
    env = {**os.environ, "AUTOFUSION_URL": live_service.url, "AUTOFUSION_API_KEY": live_service.key}
    result = subprocess.run(
        [sys.executable, "example.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1].startswith("{"), result.stdout
    assert (tmp_path / "fused.onnx").stat().st_size > 0 and (tmp_path / "bundle.tgz").stat().st_size > 0
