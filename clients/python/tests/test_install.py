"""The package installs on its own into a fresh virtual environment and works without the engine."""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]

CHECK = """
import importlib.metadata as md, importlib.util, sys
for name in ("graph_autofusion", "autofusion_service", "onnx", "numpy"):
    assert importlib.util.find_spec(name) is None, f"{name} leaked into the fresh environment"
import graph_autofusion_client as gac
assert gac.Client and gac.AsyncClient and gac.__version__ == md.version("graph-autofusion-client")
print(sorted(md.requires("graph-autofusion-client")))
"""


def test_installs_and_imports_in_a_fresh_venv(tmp_path: Path) -> None:
    source = tmp_path / "src"
    shutil.copytree(
        PACKAGE, source, ignore=shutil.ignore_patterns("tests", "*.egg-info", "build", "__pycache__")
    )
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)  # the running pip installs into it: seconds instead of ensurepip
    python = env_dir / "bin" / "python"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", str(source)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    result = subprocess.run(
        [str(python), "-I", "-c", CHECK], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['httpx==0.28.1', 'pydantic==2.13.4']"
    cli = subprocess.run(
        [str(env_dir / "bin" / "autofusion-client"), "--help"], capture_output=True, text=True, timeout=60
    )
    assert cli.returncode == 0 and "exit codes" in cli.stdout
