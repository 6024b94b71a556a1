"""The one place the service and its workers read configuration from.

Every knob is an environment variable with the `AUTOFUSION_` prefix (see docs/service.md). The API
process, the worker processes and `autofusion serve` all build this same model, so a deployment is
configured once and both sides agree on limits, leases and storage paths.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Service and worker configuration (environment variables `AUTOFUSION_*`)."""

    model_config = SettingsConfigDict(env_prefix="AUTOFUSION_", extra="ignore")

    redis_url: str | None = Field(
        default=None,
        description="Redis URL for the job store and the Celery broker. Unset: embedded mode "
        "(SQLite job store and a file-system broker in the data dir).",
    )
    redis_prefix: str = Field(default="af", description="Key prefix of the job store in Redis.")
    data_dir: Path = Field(
        default=Path(".autofusion"),
        description="Blob store, embedded job store, embedded broker and the generated key file.",
    )
    api_keys: str = Field(
        default="",
        description="Comma-separated `tenant:key` pairs; `tenant:sha256:<hex>` gives a key by its hash. "
        "Unset: a key file in the data dir (created on first `autofusion serve`).",
    )
    max_upload_mb: float = Field(default=512.0, gt=0, description="Largest accepted model upload, MiB.")
    soft_time_limit: int = Field(default=1800, gt=0, description="Seconds before a job is asked to stop.")
    hard_time_limit: int = Field(default=1900, gt=0, description="Seconds before a job's process is killed.")
    visibility_timeout: int = Field(
        default=3600, gt=0, description="Seconds before Redis redelivers an unacknowledged job message."
    )
    lease_seconds: float = Field(
        default=30.0,
        gt=0,
        description="A running job whose worker has not renewed it for this long is swept.",
    )
    heartbeat_interval: float = Field(default=5.0, gt=0, description="Seconds between worker heartbeats.")
    sweep_interval: float = Field(default=5.0, gt=0, description="Seconds between lease sweeps.")
    max_attempts: int = Field(
        default=2, ge=1, description="Runs of one job before a worker death fails it as `worker_crashed`."
    )
    worker_concurrency: int = Field(default=1, ge=1, description="Job processes per worker.")
    store_wait: float = Field(
        default=300.0,
        gt=0,
        description="Seconds a worker waits for an unreachable job store (a Redis restart) to claim or "
        "finish a job; after that the run ends and the lease sweep requeues the job.",
    )
    broker_poll_interval: float = Field(
        default=0.2, gt=0, description="Seconds between polls of the embedded file-system broker."
    )
    # --- the engine's own knobs -------------------------------------------------------------
    # The engine (graph_autofusion) reads these variables itself and never imports the service; they
    # are declared here so that one model documents and validates every `AUTOFUSION_*` variable, and
    # `engine_environment()` hands the validated values to the engine in each worker process.
    cache_dir: Path | None = Field(
        default=None,
        description="Compiled-kernel cache of the workers (`AUTOFUSION_CACHE_DIR`, read by the engine); "
        "default `<data_dir>/cache`.",
    )
    cache_max_bytes: int | None = Field(
        default=None,
        ge=0,
        description="Size bound of the kernel cache in bytes, least recently used kernels evicted first "
        "(read by the engine; engine default 2 GiB).",
    )
    isa: str | None = Field(
        default=None,
        description="Instruction set kernels are compiled for: `host`, `v1`..`v4`, `x86-64-vN` or `generic`, "
        "optionally with `+extension`s such as `v4+avx512vnni` (read by the engine; default: the host's).",
    )
    cc: str | None = Field(
        default=None,
        description="C compiler command for the kernels, optionally with a wrapper (`ccache gcc`; read by "
        "the engine; default `cc`).",
    )
    cc_timeout: float | None = Field(
        default=None, gt=0, description="Seconds one kernel compilation may take (read by the engine)."
    )
    blas_threads: int | None = Field(
        default=None,
        ge=1,
        description="OpenBLAS threads of BLAS-backed kernels (read by the engine; default 1, since the "
        "kernels of a job already run in parallel).",
    )
    contraction: Literal["blas", "library"] | None = Field(
        default=None,
        description="How Conv/MatMul/Gemm kernels contract a constant weight operand: `library` (the "
        "engine's contraction library, weights packed once at load) or `blas` (OpenBLAS per tile); "
        "read by the engine; default `library`.",
    )
    triton_interpret: bool = Field(
        default=False,
        description="Workers of the Triton targets (`cuda`, `ascend910`) run their kernels in Triton's CPU "
        "interpreter instead of on the device (`autofusion worker --interpret`): for CI and hosts "
        "without the accelerator. The device checks at start are skipped; only triton is needed.",
    )
    log_level: str = Field(default="INFO", description="Log level of the API and the workers.")
    retry_after: int = Field(default=1, ge=1, description="`Retry-After` seconds on unfinished jobs.")
    debug_stage_delay: float = Field(
        default=0.0,
        ge=0,
        description="Fault-injection aid: seconds a worker sleeps after each progress report. Keep 0.",
    )

    @field_validator("api_keys")
    @classmethod
    def _keys_parse(cls, value: str) -> str:
        from .keys import parse_api_keys

        parse_api_keys(value)  # raises ValueError naming the bad entry (never echoing a whole key)
        return value

    @field_validator("isa")
    @classmethod
    def _isa_is_known(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        from graph_autofusion.backend.cpu.isa import parse_isa
        from graph_autofusion.errors import FusionError

        try:
            parse_isa(value)  # the engine's own parser, so both accept exactly the same spellings
        except FusionError as exc:
            raise ValueError(exc.message) from None
        return value.strip()

    @field_validator("cc")
    @classmethod
    def _cc_not_blank(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None  # an empty variable means "the engine's default", as the engine reads it
        return value.strip()

    @model_validator(mode="after")
    def _limits_are_ordered(self) -> Settings:
        # A message must never be redelivered while its first run may still legitimately be alive.
        if not self.soft_time_limit < self.hard_time_limit < self.visibility_timeout:
            raise ValueError(
                "time limits must satisfy soft_time_limit < hard_time_limit < visibility_timeout, got "
                f"{self.soft_time_limit} / {self.hard_time_limit} / {self.visibility_timeout}"
            )
        return self

    @property
    def embedded(self) -> bool:
        return not self.redis_url

    @property
    def blob_dir(self) -> Path:
        return self.data_dir / "blobs"

    @property
    def kernel_cache_dir(self) -> Path:
        return self.cache_dir or self.data_dir / "cache"

    def engine_environment(self) -> dict[str, str]:
        """The engine's variables with their validated values, for a worker's `os.environ`: the
        engine reads them from there, and the kernel cache defaults to the data dir's (shared)."""
        values: dict[str, object | None] = {
            "CACHE_DIR": self.kernel_cache_dir.resolve(),
            "CACHE_MAX_BYTES": self.cache_max_bytes,
            "ISA": self.isa,
            "CC": self.cc,
            "CC_TIMEOUT": self.cc_timeout,
            "BLAS_THREADS": self.blas_threads,
            "CONTRACTION": self.contraction,
        }
        prefix = self.model_config["env_prefix"]
        env = {f"{prefix}{name}": str(value) for name, value in values.items() if value is not None}
        if self.triton_interpret:
            # Triton reads it once, when it is first imported (the worker sets it before that).
            env["TRITON_INTERPRET"] = "1"
        return env

    @property
    def max_upload_bytes(self) -> int:
        return int(self.max_upload_mb * 1024 * 1024)
