"""The layout the design card names: `service/` and `worker/` apps over a shared `core/`.

Neither app imports the other (the API enqueues by task name), the core imports neither, and the
library's command line registers `serve` and `worker` without loading FastAPI or Celery."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FOLDERS = {"core": "autofusion_core", "service": "autofusion_service", "worker": "autofusion_worker"}
FORBIDDEN = {
    "core": {"autofusion_service", "autofusion_worker"},
    "service": {"autofusion_worker"},
    "worker": {"autofusion_service"},
}


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("folder", sorted(FOLDERS))
def test_apps_do_not_import_each_other(folder: str) -> None:
    offenders = {
        f"{path.relative_to(REPO)}: {name}"
        for path in (REPO / folder).rglob("*.py")
        for name in imported_modules(path)
        if name.split(".")[0] in FORBIDDEN[folder]
    }
    assert not offenders


@pytest.mark.parametrize(("folder", "name"), sorted(FOLDERS.items()))
def test_folders_install_under_their_import_names(folder: str, name: str) -> None:
    module = __import__(name)
    assert Path(module.__file__).resolve().parent == REPO / folder


def test_cli_registers_serve_and_worker_without_loading_the_apps() -> None:
    script = (
        "import sys; from graph_autofusion.cli import build_parser; p = build_parser();"
        "p.parse_args(['serve', '--port', '1']); p.parse_args(['worker', '--targets', 'cpu']);"
        "print(sorted(m for m in ('fastapi', 'celery', 'kombu', 'uvicorn') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
