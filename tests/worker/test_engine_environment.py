"""The engine's `AUTOFUSION_*` variables: declared and validated by the settings model, and handed to
the engine (which reads its environment and never imports the service) by the worker."""

from __future__ import annotations

from pathlib import Path

import pytest

from autofusion_core.settings import Settings
from autofusion_worker.cli import apply_engine_environment
from graph_autofusion.backend.cpu import blas, cache, compiler, contraction, isa

ENGINE_VARS = (
    "AUTOFUSION_ISA",
    "AUTOFUSION_CC",
    "AUTOFUSION_CC_TIMEOUT",
    "AUTOFUSION_BLAS_THREADS",
    "AUTOFUSION_CONTRACTION",
    "AUTOFUSION_CACHE_MAX_BYTES",
    "AUTOFUSION_CACHE_DIR",
)


def test_every_engine_variable_is_a_documented_settings_field() -> None:
    prefix = Settings.model_config["env_prefix"]
    fields = {f"{prefix}{name}".upper(): info for name, info in Settings.model_fields.items()}
    for var in ENGINE_VARS:
        assert var in fields, f"{var} is read by the engine but not declared in Settings"
        assert fields[var].description, f"{var} has no description"
    # the engine reads exactly these names
    assert {isa.ISA_ENV, compiler.CC_ENV, compiler.CC_TIMEOUT_ENV, blas.BLAS_THREADS_ENV} <= set(ENGINE_VARS)
    assert contraction.CONTRACTION_ENV in ENGINE_VARS
    assert {cache.CACHE_DIR_ENV, cache.CACHE_MAX_BYTES_ENV} <= set(ENGINE_VARS)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("isa", "v9"),
        ("isa", "pentium"),
        ("cc_timeout", "0"),
        ("blas_threads", "0"),
        ("contraction", "mkl"),
        ("cache_max_bytes", "-1"),
    ],
)
def test_bad_engine_values_are_refused_at_start(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(f"AUTOFUSION_{name.upper()}", value)
    with pytest.raises(ValueError, match=name):
        Settings()


def test_the_worker_hands_validated_values_to_the_engine(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for var in ENGINE_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AUTOFUSION_ISA", " x86-64-v2 ")
    monkeypatch.setenv("AUTOFUSION_CC", "ccache  gcc")
    monkeypatch.setenv("AUTOFUSION_CC_TIMEOUT", "12.5")
    monkeypatch.setenv("AUTOFUSION_BLAS_THREADS", "3")
    monkeypatch.setenv("AUTOFUSION_CONTRACTION", "blas")
    monkeypatch.setenv("AUTOFUSION_CACHE_MAX_BYTES", "1048576")
    settings = Settings(data_dir=tmp_path)
    apply_engine_environment(settings)
    # what the engine itself now sees
    if isa.machine() == "x86_64":
        assert isa.target_isa().level == 2
    assert compiler._timeout() == 12.5
    assert blas._default_threads() == 3
    assert contraction.contraction_mode() == "blas"
    assert cache.KernelCache().max_bytes == 1048576
    # the kernel cache defaults to the data dir's, shared by every worker on the volume
    assert cache.default_cache_dir() == (tmp_path / "cache").resolve()
    import os

    assert os.environ["AUTOFUSION_ISA"] == "x86-64-v2" and os.environ["AUTOFUSION_CC"] == "ccache  gcc"


def test_unset_engine_values_leave_the_engine_defaults(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for var in ENGINE_VARS:
        monkeypatch.delenv(var, raising=False)
    env = Settings(data_dir=tmp_path, cache_dir=tmp_path / "k").engine_environment()
    assert env == {"AUTOFUSION_CACHE_DIR": str((tmp_path / "k").resolve())}
