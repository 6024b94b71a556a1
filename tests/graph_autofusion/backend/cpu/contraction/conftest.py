"""The library built once per module for every ISA this host can run (the widest first)."""

from __future__ import annotations

import pytest

from graph_autofusion.backend.cpu.cache import KernelCache
from graph_autofusion.backend.cpu.contraction.shim import Library, build_library
from graph_autofusion.backend.cpu.isa import host_isa, parse_isa

RUNNABLE = [name for name in ("v4", "v3", "generic") if parse_isa(name).runs_on(host_isa())]


@pytest.fixture(scope="module", params=RUNNABLE)
def lib(request: pytest.FixtureRequest, kernel_cache: KernelCache) -> Library:
    return build_library(parse_isa(request.param), cache=kernel_cache)
