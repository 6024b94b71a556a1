"""README's library example runs as written (in a scratch directory)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_library_example_runs(tmp_path: Path) -> None:
    block = re.search(r"```python\n(import graph_autofusion as gaf\n.*?)```", README.read_text(), re.S)
    assert block, "README lost its library example"
    done = subprocess.run(
        [sys.executable, "-c", block.group(1)], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "bert.fused.onnx").exists() and (tmp_path / "bert.bundle" / "manifest.json").exists()
    assert "True" in done.stdout
