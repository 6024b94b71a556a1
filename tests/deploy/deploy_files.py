"""What the deployment tests compare the files against, read from the code itself.

No container engine runs in CI, so the Dockerfile, the Compose file and the manifests are checked
as files; the facts they must agree with — the settings' environment variables, the app's routes,
the exported metric names, the command line — come from the service's own modules, never from a
list kept here.
"""

from __future__ import annotations

import argparse
import re
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from autofusion_core.settings import Settings

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"
ENV_EXAMPLE = REPO / ".env.example"
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
K8S = REPO / "deploy" / "k8s"
HEALTHCHECK = REPO / "deploy" / "docker" / "healthcheck.py"
#: Where the Dockerfile puts the repository (its WORKDIR); checked in test_dockerfile.py.
IMAGE_ROOT = "/app"
IMAGE_HEALTHCHECK = f"{IMAGE_ROOT}/{HEALTHCHECK.relative_to(REPO).as_posix()}"


def env_prefix() -> str:
    return Settings.model_config["env_prefix"]


def settings_env_names() -> set[str]:
    """Every environment variable the settings model reads (prefix + field name, upper case)."""
    return {f"{env_prefix()}{name}".upper() for name in Settings.model_fields}


def settings_from_env(env: dict[str, Any]) -> Settings:
    """Build the settings from `AUTOFUSION_*` values as the service would (types, cross-checks)."""
    prefix = env_prefix()
    values = {k.removeprefix(prefix).lower(): str(v) for k, v in env.items() if k.startswith(prefix)}
    return Settings(**values)


def autofusion_parser() -> argparse.ArgumentParser:
    """The real `autofusion` command line (the images' entry point)."""
    from graph_autofusion.cli import build_parser

    return build_parser()


@cache
def _app() -> Any:
    """The FastAPI app as `create_app` builds it (embedded mode, on a throwaway data dir)."""
    import tempfile

    from autofusion_service.main import create_app

    tmp = tempfile.TemporaryDirectory(prefix="deploy-test-app-")
    app = create_app(Settings(data_dir=Path(tmp.name), api_keys=""))
    app.state.deploy_test_tmp = tmp  # removed with the app, at interpreter exit
    return app


def app_serves(path: str, method: str = "GET") -> bool:
    """Does the app route `method path` to an endpoint (Starlette's own matching, so routers
    included at any depth count)?"""
    from starlette.routing import Match

    scope = {"type": "http", "path": path, "method": method, "root_path": "", "headers": []}
    return any(route.matches(scope)[0] == Match.FULL for route in _app().router.routes)


_VAR = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}|\$\$")


def compose_variables(text: str) -> set[str]:
    """Names Compose interpolates in `text` (`${NAME}`, `${NAME:-default}`, …)."""
    return {m["name"] for m in _VAR.finditer(text) if m["name"]}


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's interpolation of one value, with `env` as the shell/.env (defaults applied)."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name, op, arg = m["name"], m["op"], m["arg"] or ""
        current = env.get(name)
        if op in (":-", "-"):
            unset = current is None or (op == ":-" and current == "")
            return arg if unset else current
        if op in (":?", "?"):
            if current is None or (op == ":?" and current == ""):
                raise ValueError(f"required variable {name} is not set: {arg}")
            return current
        return current or ""

    return _VAR.sub(one, value)


def load_compose(env: dict[str, str] | None = None) -> dict[str, Any]:
    """docker-compose.yml parsed (YAML anchors and merges resolved) and interpolated."""
    return interpolate(yaml.safe_load(COMPOSE.read_text()), env or {})


def read_env_file(path: Path) -> dict[str, str]:
    """A Compose `.env` file: `NAME=value` lines, comments and blank lines ignored."""
    values: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        assert sep, f"{path.name}: not NAME=value: {line!r}"
        values[name.strip()] = value.strip()
    return values


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s|us)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6}


def compose_duration_s(text: str) -> float:
    """Seconds of a Compose duration such as `1960s`, `1m30s` or `1h`."""
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a Compose duration: {text!r}")
    return sum(float(n) * _UNIT_S[u] for n, u in parts)


def k8s_documents() -> dict[str, list[dict[str, Any]]]:
    """Every manifest under deploy/k8s (but the kustomization), by file name."""
    docs: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs[path.name] = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return docs
