"""The data dir is private: dirs 0700, files 0600, whatever the umask of the process."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from harness import fast_settings, tiny_model

from autofusion_core.files import private_dir
from autofusion_service import create_app


@pytest.fixture
def loose_umask() -> Iterator[None]:
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def _modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in [root, *root.rglob("*")]}


def test_data_dir_files_are_private_to_the_service_user(tmp_path: Path, loose_umask: None) -> None:
    data = tmp_path / "data"
    with TestClient(create_app(fast_settings(data))) as client:
        answer = client.post(
            "/fuse",
            files={"model": ("m.onnx", tiny_model())},
            headers={"Authorization": "Bearer alice-key-0123456789"},
        )
        assert answer.status_code == 202, answer.text
    modes = _modes(data)
    assert "jobs.sqlite3" in modes and any(name.startswith("blobs/") and len(name) > 60 for name in modes)
    # The embedded broker's message files are kombu's, created with the umask: `serve` and `worker`
    # set it to 077; under a library's 022 they are still unreachable inside their 0700 folders.
    loose = {
        name: oct(mode)
        for name, mode in modes.items()
        if ((data / name).is_dir() and mode != 0o700)
        or (not (data / name).is_dir() and not name.startswith("broker/") and mode != 0o600)
    }
    assert not loose


def test_an_existing_loose_data_dir_is_tightened(tmp_path: Path) -> None:
    folder = tmp_path / "old"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    private_dir(folder)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
