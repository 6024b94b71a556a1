"""Fixtures of the CPU backend tests: one kernel cache per test session, shared by every test."""

from __future__ import annotations

import pytest

from graph_autofusion.backend.cpu.cache import KernelCache


@pytest.fixture(scope="session")
def kernel_cache(tmp_path_factory: pytest.TempPathFactory) -> KernelCache:
    return KernelCache(tmp_path_factory.mktemp("kernels"))
