"""The Dockerfile and .dockerignore, checked as files: the install step is CI's, the worker image
alone carries the compiler and BLAS, nothing secret is baked in."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from deploy_files import (
    DOCKERFILE,
    DOCKERIGNORE,
    HEALTHCHECK,
    IMAGE_HEALTHCHECK,
    IMAGE_ROOT,
    REPO,
    app_serves,
    autofusion_parser,
    env_prefix,
    settings_env_names,
)

CI = REPO / ".ci" / "run"
RUN = REPO / "run"
BLAS_PACKAGE = "scipy-openblas32"


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args(self, keyword: str) -> list[str]:
        return [a for k, a in self.instructions if k == keyword]


def _instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction: continuations joined, comment lines dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, rest = (pending + line).partition(" ")
        out.append((keyword.upper(), " ".join(rest.split())))
        pending = ""
    return out


def _stages(dockerfile: Path = DOCKERFILE) -> dict[str, Stage]:
    global_args: dict[str, str] = {}
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for keyword, args in _instructions(dockerfile.read_text()):
        if keyword == "FROM":
            parts = args.split()
            base = re.sub(r"\$\{(\w+)\}", lambda m: global_args.get(m[1], m[0]), parts[0])
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else str(len(stages))
            current = stages[name] = Stage(name, base)
        elif current is None:
            if keyword == "ARG" and "=" in args:
                name, _, value = args.partition("=")
                global_args[name] = value
        else:
            current.instructions.append((keyword, args))
    return stages


def _chain(stages: dict[str, Stage], name: str) -> list[Stage]:
    """A stage and the stages it is built FROM, nearest first."""
    out = []
    while name in stages:
        out.append(stages[name])
        name = stages[name].base
    return out


def _copied_from(stage: Stage) -> set[str]:
    return {m[1] for a in stage.args("COPY") for m in [re.match(r"--from=(\S+)", a)] if m}


def _exec_form(args: str) -> list[str]:
    return json.loads(args)


@pytest.fixture(scope="module")
def stages() -> dict[str, Stage]:
    return _stages()


def test_multi_stage_slim_python_311_with_api_and_worker_targets(stages: dict[str, Stage]) -> None:
    assert {"api", "worker"} <= set(stages) and len(stages) >= 3
    roots = {s.base for s in stages.values() if s.base not in stages}
    assert len(roots) == 1
    (root,) = roots
    assert re.fullmatch(r"python:3\.11(\.\d+)?-slim(-\w+)?", root), root


def test_images_install_with_the_command_ci_uses(stages: dict[str, Stage]) -> None:
    ci = [shlex.split(line, comments=True) for line in CI.read_text().splitlines()]
    ci = [words for words in ci if words[:2] == ["./run", "install"]]
    assert ci, ".ci/run must call the shared install step"
    (ci_cmd,) = ci
    runs = [a for s in stages.values() for a in s.args("RUN")]
    installs = [shlex.split(cmd.strip()) for a in runs for cmd in a.split("&&") if "./run install" in cmd]
    assert installs, "the Dockerfile must install with ./run install"
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for cmd in installs:
        # the same program and subcommand; images only leave out the dev extras, and an
        # accelerator image adds its own extra of pyproject.toml
        common = [*ci_cmd, "--no-dev"]
        assert cmd[: len(common)] == common, cmd
        rest = cmd[len(common) :]
        assert rest == [] or (len(rest) == 2 and rest[0] == "--extra" and rest[1] in extras), cmd
        assert "dev" not in rest, cmd
    assert "--no-dev" in RUN.read_text()
    # Nothing else installs Python packages behind the shared step's back.
    assert not [a for a in runs if re.search(r"pip3? install", a)], runs
    # ./run serve and ./run test go through the same install function.
    body = RUN.read_text()
    assert re.search(r"^install\(\) \{", body, re.M) and re.search(r"^install$", body, re.M)


def test_compiler_and_blas_only_in_the_worker_image(stages: dict[str, Stage]) -> None:
    def apt_packages(chain: list[Stage]) -> set[str]:
        pkgs: set[str] = set()
        for stage in chain:
            for run in stage.args("RUN"):
                for cmd in run.split("&&"):
                    words = cmd.split()
                    if "apt-get" in words and "install" in words:
                        pkgs |= {w for w in words[words.index("install") + 1 :] if not w.startswith("-")}
        return pkgs

    worker, api = _chain(stages, "worker"), _chain(stages, "api")
    assert {"gcc", "libc6-dev"} <= apt_packages(worker)
    assert not {"gcc", "libc6-dev", "build-essential", "clang"} & apt_packages(api)
    # BLAS is a pinned Python dependency: the worker copies the full environment, the API one
    # from a stage that uninstalled it.
    pins = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(p.split("==")[0] == BLAS_PACKAGE for p in pins)
    (api_source,) = _copied_from(stages["api"])
    (worker_source,) = _copied_from(stages["worker"])
    api_runs = " ".join(a for s in _chain(stages, api_source) for a in s.args("RUN"))
    worker_runs = " ".join(a for s in _chain(stages, worker_source) for a in s.args("RUN"))
    assert re.search(rf"pip uninstall -y( -q)? {BLAS_PACKAGE}", api_runs)
    assert BLAS_PACKAGE not in worker_runs


def test_final_images_run_as_a_non_root_user_with_a_healthcheck(stages: dict[str, Stage]) -> None:
    for name in ("api", "worker"):
        users = [a for s in reversed(_chain(stages, name)) for a in s.args("USER")]
        assert users and users[-1] not in ("root", "0"), name
        checks = [a for s in _chain(stages, name) for a in s.args("HEALTHCHECK")]
        assert checks, name
        argv = _exec_form(checks[0].split("CMD", 1)[1])
        assert argv[:2] == ["python", IMAGE_HEALTHCHECK], argv
        if argv[2] == "http":
            assert app_serves(argv[3]), argv
    workdirs = [a for s in _chain(stages, "api") for a in s.args("WORKDIR")]
    assert workdirs[0] == IMAGE_ROOT
    copied = " ".join(a for s in stages.values() for a in s.args("COPY"))
    assert str(HEALTHCHECK.relative_to(REPO)) in copied


def test_entrypoint_and_commands_are_real_autofusion_commands(stages: dict[str, Stage]) -> None:
    entry = next(_exec_form(a) for s in _chain(stages, "api") for a in s.args("ENTRYPOINT"))
    assert entry[-1] == "autofusion"  # behind an init (tini) that forwards SIGTERM
    parser = autofusion_parser()
    api = parser.parse_args(_exec_form(stages["api"].args("CMD")[-1]))
    worker = parser.parse_args(_exec_form(stages["worker"].args("CMD")[-1]))
    assert api.command == "serve" and api.host == "0.0.0.0"
    assert f"{api.port}" in stages["api"].args("EXPOSE")
    assert worker.command == "worker" and worker.targets == "cpu"


def test_the_cuda_worker_image_serves_cuda_with_the_cuda_extra(stages: dict[str, Stage]) -> None:
    """`worker-cuda` is the worker image plus torch and triton: the same compiler stage, an
    environment built with `./run install --no-dev --extra cuda`, a non-root user, the worker's
    health check, and `worker --targets cuda` (a registered target whose backend is Triton)."""
    from autofusion_core.targets import TARGETS

    chain = _chain(stages, "worker-cuda")
    assert "worker-base" in {s.name for s in chain} and "worker-base" in {
        s.name for s in _chain(stages, "worker")
    }
    (source,) = _copied_from(stages["worker-cuda"])
    runs = " ".join(a for s in _chain(stages, source) for a in s.args("RUN"))
    assert "./run install --no-dev --extra cuda" in runs
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {p.split("==")[0] for p in extras["cuda"]} >= {"torch", "triton"}
    assert all("==" in p for p in extras["cuda"] + extras["ascend910"])  # pinned
    users = [a for s in reversed(chain) for a in s.args("USER")]
    assert users and users[-1] not in ("root", "0")
    checks = [a for s in chain for a in s.args("HEALTHCHECK")]
    assert _exec_form(checks[0].split("CMD", 1)[1])[:3] == ["python", IMAGE_HEALTHCHECK, "worker"]
    worker = autofusion_parser().parse_args(_exec_form(stages["worker-cuda"].args("CMD")[-1]))
    assert worker.command == "worker" and worker.targets == "cuda"
    assert TARGETS["cuda"].compiles and TARGETS["cuda"].backend == "triton"


def test_no_secrets_and_only_settings_variables_baked_in(stages: dict[str, Stage]) -> None:
    secretish = re.compile(r"KEY|SECRET|PASSWORD|TOKEN|REDIS_URL", re.I)
    for stage in stages.values():
        for keyword in ("ENV", "ARG"):
            for args in stage.args(keyword):
                names = re.findall(r"(?:^|\s)([A-Za-z_][A-Za-z0-9_]*)=", args)
                assert not [n for n in names if secretish.search(n)], (stage.name, args)
                ours = {n for n in names if n.startswith(env_prefix())}
                assert ours <= settings_env_names(), ours
    labels = " ".join(a for s in _chain(stages, "api") for a in s.args("LABEL"))
    for key in ("title", "version", "revision", "source", "licenses", "created"):
        assert f"org.opencontainers.image.{key}=" in labels
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert f"VERSION={version}" in [a for s in _chain(stages, "api") for a in s.args("ARG")]


def test_dockerignore_allows_exactly_what_the_build_copies(stages: dict[str, Stage]) -> None:
    rules = [r for r in DOCKERIGNORE.read_text().splitlines() if r.strip() and not r.startswith("#")]
    assert rules[0] == "*", "an allow-list: nothing enters the build context unless named"
    allowed = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    for stage in stages.values():
        for args in stage.args("COPY"):
            if args.startswith("--from="):
                continue
            for source in args.split()[:-1]:
                assert source.rstrip("/") in allowed, f"COPY {source} is excluded by .dockerignore"
                assert (REPO / source).exists(), source
    assert not {".venv", ".env", ".git", "tests"} & allowed


def test_the_api_runs_without_blas(tmp_path: Path) -> None:
    """What the API image leaves out (scipy-openblas32) is never imported by the API: build the app,
    probe it and submit a model with that package made unimportable."""
    script = textwrap.dedent(
        """
        import importlib.abc, sys

        class NoBlas(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "scipy_openblas32":
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
                return None

        sys.meta_path.insert(0, NoBlas())
        sys.path.insert(0, sys.argv[1])
        from pathlib import Path
        from fastapi.testclient import TestClient
        from autofusion_service.main import create_app
        from autofusion_core.settings import Settings
        from harness import tiny_model

        settings = Settings(data_dir=Path(sys.argv[2]), api_keys="t:deploy-test-key-0123456789")
        with TestClient(create_app(settings)) as client:
            assert client.get("/healthz").status_code == 200
            auth = {"Authorization": "Bearer deploy-test-key-0123456789"}
            files = {"model": ("m.onnx", tiny_model())}
            answer = client.post("/fuse", files=files, headers=auth)
            assert answer.status_code == 202, answer.text
        assert "scipy_openblas32" not in sys.modules
        print("api ok without blas")
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(env_prefix())}
    harness_dir = REPO / "tests" / "service"
    done = subprocess.run(
        [sys.executable, "-c", script, str(harness_dir), str(tmp_path)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "api ok without blas" in done.stdout, done.stderr[-3000:]


ASCEND_DOCKERFILE = REPO / "deploy" / "docker" / "ascend910.Dockerfile"


def test_the_ascend_worker_image_installs_the_pinned_extra_on_cann() -> None:
    """deploy/docker/ascend910.Dockerfile: CANN's base image (its own file: a second base), the
    project's install step with the `ascend910` extra, the versions its header states equal to
    pyproject's pins, a non-root user, the worker health check, `worker --targets ascend910`."""
    stages = _stages(ASCEND_DOCKERFILE)
    final = stages["worker-ascend910"]
    assert re.fullmatch(r"ascendai/cann:8\.5\.0-\S+", final.base), final.base
    (source,) = _copied_from(final)
    runs = [shlex.split(cmd.strip()) for a in stages[source].args("RUN") for cmd in a.split("&&")]
    assert ["./run", "install", "--no-dev", "--extra", "ascend910"] in runs
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pins = dict(p.split("==") for p in extras["ascend910"])
    assert set(pins) == {"torch", "torch-npu", "triton-ascend"}  # never upstream triton beside it
    header = ASCEND_DOCKERFILE.read_text()
    for package, version in pins.items():
        assert re.search(rf"^#\s+{re.escape(package)}\s+{re.escape(version)}\b", header, re.M), package
    assert pins["torch-npu"].split(".")[:2] == pins["torch"].split(".")[:2]
    users = [a for a in final.args("USER")]
    assert users and users[-1] not in ("root", "0")
    (check,) = final.args("HEALTHCHECK")
    assert _exec_form(check.split("CMD", 1)[1])[:3] == ["python", IMAGE_HEALTHCHECK, "worker"]
    worker = autofusion_parser().parse_args(_exec_form(final.args("CMD")[-1]))
    assert worker.command == "worker" and worker.targets == "ascend910"
    entry = _exec_form(final.args("ENTRYPOINT")[-1])
    assert entry[:2] == ["tini", "--"] and "set_env.sh" in " ".join(entry)  # CANN's environment
