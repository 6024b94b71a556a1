"""Triton backend tests run every generated kernel in Triton's CPU interpreter.

They skip (with the reason) only where triton or torch is not importable; the dev extra that
`./run test` installs carries both, so CI runs them.
"""

from __future__ import annotations

import os

import pytest

# No device here: every kernel runs in Triton's CPU interpreter. Triton decides that when its own
# library functions (tl.sum, ...) are defined, so it must be set before triton is first imported.
os.environ["TRITON_INTERPRET"] = "1"

pytest.importorskip("torch", reason="the Triton targets run on torch tensors (dev extra)")
pytest.importorskip("triton", reason="the Triton targets need triton (dev extra)")


@pytest.fixture(scope="session")
def triton_cache(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return tmp_path_factory.mktemp("triton-kernels")
