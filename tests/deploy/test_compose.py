"""docker-compose.yml and .env.example, checked as files against the service's own code."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urlparse

import pytest
from deploy_files import (
    COMPOSE,
    ENV_EXAMPLE,
    IMAGE_HEALTHCHECK,
    REPO,
    app_serves,
    autofusion_parser,
    compose_duration_s,
    compose_variables,
    env_prefix,
    load_compose,
    read_env_file,
    settings_env_names,
    settings_from_env,
)

from autofusion_core.targets import TARGETS

CORE = ("redis", "api", "worker")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_compose()


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):  # the `- NAME=value` form
        env = dict(item.partition("=")[::2] for item in env)
    return {k: str(v) for k, v in env.items()}


def _mounts(service: dict[str, Any]) -> dict[str, str]:
    """Container path → source (volume name or host path) of a service's short-form volumes."""
    mounts = {}
    for spec in service.get("volumes", []):
        source, target = spec.split(":")[:2]
        mounts[target] = source
    return mounts


def _healthcheck_argv(service: dict[str, Any]) -> list[str]:
    test = service["healthcheck"]["test"]
    assert isinstance(test, list) and test[0] == "CMD", "healthchecks use the exec form"
    return test[1:]


def test_core_services_run_by_default_and_extras_are_profiles(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name in CORE:
        assert name in services
        assert not services[name].get("profiles"), f"{name} must start with a plain `docker compose up`"
    assert services["flower"]["profiles"] == ["flower"]
    for name in set(services) - set(CORE) - {"flower"}:
        assert services[name].get("profiles"), f"{name} is optional and needs a profile"


def test_redis_keeps_an_append_only_file_on_a_volume(compose: dict[str, Any]) -> None:
    redis = compose["services"]["redis"]
    command = redis["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"
    data = _mounts(redis)["/data"]  # the redis image's working dir, where appendonly files go
    assert data in compose["volumes"], "a named volume, not the container's own layer"
    assert "redis-cli" in redis["healthcheck"]["test"]


def test_api_serves_port_8000_and_its_healthcheck_is_readyz(compose: dict[str, Any]) -> None:
    api = compose["services"]["api"]
    assert api["build"]["target"] == "api"
    args = autofusion_parser().parse_args(api["command"])
    assert args.command == "serve" and args.host == "0.0.0.0" and args.port == 8000
    published = {int(p.rsplit(":", 1)[1]) for p in api["ports"]}
    assert published == {args.port}
    argv = _healthcheck_argv(api)
    assert argv[:2] == ["python", IMAGE_HEALTHCHECK] and argv[2] == "http"
    assert argv[3] == "/readyz" and app_serves(argv[3])
    assert api["depends_on"]["redis"]["condition"] == "service_healthy"
    assert api["stop_signal"] == "SIGTERM"


def test_worker_serves_cpu_and_scales(compose: dict[str, Any]) -> None:
    worker = compose["services"]["worker"]
    assert worker["build"]["target"] == "worker"
    args = autofusion_parser().parse_args(worker["command"])
    assert args.command == "worker" and args.targets == "cpu" and args.targets in TARGETS
    assert worker["deploy"]["replicas"] >= 1
    # `--scale worker=N` needs containers that do not claim one name or one host port.
    assert "container_name" not in worker and "ports" not in worker and "hostname" not in worker
    assert _healthcheck_argv(worker)[:3] == ["python", IMAGE_HEALTHCHECK, "worker"]


def test_worker_stop_grace_outlasts_the_hard_time_limit(compose: dict[str, Any]) -> None:
    worker = compose["services"]["worker"]
    assert worker["stop_signal"] == "SIGTERM"  # Celery's warm shutdown
    hard = settings_from_env(_env(worker)).hard_time_limit
    assert compose_duration_s(worker["stop_grace_period"]) > hard
    # ... also when .env raises the limit to what .env.example suggests
    example = settings_from_env(_env(load_compose(read_env_file(ENV_EXAMPLE))["services"]["worker"]))
    assert compose_duration_s(worker["stop_grace_period"]) > example.hard_time_limit


def test_api_and_workers_share_the_blob_and_cache_volume(compose: dict[str, Any]) -> None:
    services = compose["services"]
    sources = set()
    for name in ("api", "worker"):
        settings = settings_from_env(_env(services[name]))
        mounts = _mounts(services[name])
        data_dir = PurePosixPath(settings.data_dir)
        cache_dir = PurePosixPath(settings.kernel_cache_dir)
        assert str(data_dir) in mounts, f"{name}: AUTOFUSION_DATA_DIR is not a mounted volume"
        assert cache_dir.is_relative_to(data_dir), f"{name}: the kernel cache is outside the volume"
        sources.add(mounts[str(data_dir)])
    assert len(sources) == 1 and sources <= set(compose["volumes"]), sources


def test_every_autofusion_variable_is_a_settings_field(compose: dict[str, Any]) -> None:
    names = settings_env_names()
    for name, service in compose["services"].items():
        env = _env(service)
        unknown = {k for k in env if k.startswith(env_prefix())} - names
        assert not unknown, f"{name} sets variables the service never reads: {sorted(unknown)}"
        if name in ("api", "worker"):
            settings = settings_from_env(env)  # values parse, and the time limits are ordered
            assert not settings.embedded
            url = urlparse(settings.redis_url)
            assert url.hostname == "redis" and url.hostname in compose["services"]


def test_configuration_is_documented_in_env_example() -> None:
    example = read_env_file(ENV_EXAMPLE)
    used = compose_variables(COMPOSE.read_text())
    assert used <= set(example), f"not in .env.example: {sorted(used - set(example))}"
    ours = {k for k in example if k.startswith(env_prefix())}
    assert ours <= settings_env_names(), f"not settings fields: {sorted(ours - settings_env_names())}"
    settings_from_env(example)  # the example itself is a valid configuration
    # The image's configuration carries no key: API keys come from .env, which never enters git or
    # a build context.
    assert example.get(f"{env_prefix()}API_KEYS", "") == ""


def test_files_mounted_from_the_repository_exist(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        for target, source in _mounts(service).items():
            if source.startswith("."):
                assert (REPO / source).exists(), f"{name}: {source} (mounted at {target}) is missing"


def test_the_gpu_profile_adds_a_cuda_worker_on_an_nvidia_device(compose: dict[str, Any]) -> None:
    services = compose["services"]
    worker = services["worker-cuda"]
    assert worker["profiles"] == ["gpu"] and worker["build"]["target"] == "worker-cuda"
    args = autofusion_parser().parse_args(worker["command"])
    assert args.command == "worker" and args.targets == "cuda" and TARGETS["cuda"].compiles
    (device,) = worker["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    assert _mounts(worker) == _mounts(services["worker"])  # the same blobs and kernel cache
    assert _env(worker) == _env(services["worker"])
    assert compose_duration_s(worker["stop_grace_period"]) > settings_from_env(_env(worker)).hard_time_limit
    assert _healthcheck_argv(worker)[:3] == ["python", IMAGE_HEALTHCHECK, "worker"]
