"""The Kubernetes manifests under deploy/k8s, checked as files against the service's own code."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml
from deploy_files import (
    IMAGE_HEALTHCHECK,
    K8S,
    app_serves,
    autofusion_parser,
    env_prefix,
    k8s_documents,
    settings_env_names,
    settings_from_env,
)

from autofusion_core.targets import TARGETS

NAMESPACE = "autofusion"
WORKLOADS = ("Deployment", "StatefulSet")


@pytest.fixture(scope="module")
def docs() -> dict[str, list[dict[str, Any]]]:
    return k8s_documents()


def _all(docs: dict[str, list[dict[str, Any]]], kind: str | None = None) -> list[dict[str, Any]]:
    return [d for file_docs in docs.values() for d in file_docs if kind is None or d["kind"] == kind]


def _one(docs: dict[str, list[dict[str, Any]]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in _all(docs, kind) if d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def _workers(docs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Worker Deployments by target, from their `worker-<target>.yaml` file names."""
    out = {}
    for file, file_docs in docs.items():
        if file.startswith("worker-"):
            (deployment,) = [d for d in file_docs if d["kind"] == "Deployment"]
            out[file.removeprefix("worker-").removesuffix(".yaml")] = deployment
    return out


def _pod(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def _pod_env(docs: dict[str, list[dict[str, Any]]], workload: dict[str, Any]) -> dict[str, str]:
    """The environment a workload's first container gets from envFrom and env."""
    container = _pod(workload)["containers"][0]
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env.update(_one(docs, "ConfigMap", source["configMapRef"]["name"])["data"])
        if "secretRef" in source:
            env.update(_one(docs, "Secret", source["secretRef"]["name"]).get("stringData", {}))
    env.update({e["name"]: e.get("value", "") for e in container.get("env", [])})
    return env


def test_every_manifest_parses_and_is_applied_by_the_kustomization(
    docs: dict[str, list[dict[str, Any]]],
) -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(docs)
    assert kustomization["namespace"] == NAMESPACE
    for doc in _all(docs):
        assert doc["apiVersion"] and doc["kind"] and doc["metadata"]["name"]
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == NAMESPACE
    assert _one(docs, "Namespace", NAMESPACE)


def test_required_objects_exist(docs: dict[str, list[dict[str, Any]]]) -> None:
    kinds = {d["kind"] for d in _all(docs)}
    assert {"Namespace", "ConfigMap", "Secret", "PersistentVolumeClaim", "Deployment", "Service"} <= kinds
    assert {"StatefulSet"} <= kinds
    assert {"cpu", "ascend910"} <= set(_workers(docs))


def test_redis_statefulset_keeps_an_append_only_file_on_a_claim(
    docs: dict[str, list[dict[str, Any]]],
) -> None:
    (redis,) = _all(docs, "StatefulSet")
    args = _pod(redis)["containers"][0]["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"
    data_dir = args[args.index("--dir") + 1]
    (claim,) = redis["spec"]["volumeClaimTemplates"]
    mounts = {m["mountPath"]: m["name"] for m in _pod(redis)["containers"][0]["volumeMounts"]}
    assert mounts[data_dir] == claim["metadata"]["name"]
    service = _one(docs, "Service", redis["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None"  # headless, for the pod's stable DNS name


def test_api_deployment_and_service(docs: dict[str, list[dict[str, Any]]]) -> None:
    api = _one(docs, "Deployment", "autofusion-api")
    container = _pod(api)["containers"][0]
    args = autofusion_parser().parse_args(container["args"])
    assert args.command == "serve" and args.host == "0.0.0.0"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["http"] == args.port == 8000
    service = _one(docs, "Service", "autofusion-api")
    assert service["spec"]["selector"].items() <= api["spec"]["template"]["metadata"]["labels"].items()
    (port,) = service["spec"]["ports"]
    assert port["port"] == 8000 and port["targetPort"] in ("http", 8000)
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert "preStop" in container["lifecycle"]  # the Service forgets the pod before SIGTERM


def test_every_probe_reaches_something_real(docs: dict[str, list[dict[str, Any]]]) -> None:
    healthcheck_kinds = {"http", "worker"}
    for workload in (d for d in _all(docs) if d["kind"] in WORKLOADS):
        for container in _pod(workload)["containers"]:
            where = f"{workload['metadata']['name']}/{container['name']}"
            assert "livenessProbe" in container and "readinessProbe" in container, where
            ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
            for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
                probe = container.get(kind)
                if probe is None:
                    continue
                if "httpGet" in probe:
                    assert app_serves(probe["httpGet"]["path"]), f"{where} {kind}: no such route"
                    assert probe["httpGet"]["port"] in (*ports, *ports.values()), f"{where} {kind}: port"
                elif "tcpSocket" in probe:
                    assert probe["tcpSocket"]["port"] in (*ports, *ports.values()), f"{where} {kind}"
                else:
                    command = probe["exec"]["command"]
                    if "python" in command[0]:
                        assert command[1] == IMAGE_HEALTHCHECK and command[2] in healthcheck_kinds, where


def test_workers_one_deployment_per_target(docs: dict[str, list[dict[str, Any]]]) -> None:
    for target, deployment in _workers(docs).items():
        assert target in TARGETS, f"worker-{target}.yaml: unknown target"
        container = _pod(deployment)["containers"][0]
        args = autofusion_parser().parse_args(container["args"])
        assert args.command == "worker" and args.targets.split(",") == [target]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
        # Two targets' Deployments must not select each other's pods.
        assert deployment["spec"]["selector"]["matchLabels"].get("autofusion.io/target") == target
    assert _pod(_workers(docs)["ascend910"])["nodeSelector"] == {"accelerator": "ascend910"}


def test_workers_drain_longer_than_a_job_may_run(docs: dict[str, list[dict[str, Any]]]) -> None:
    for target, deployment in _workers(docs).items():
        settings = settings_from_env(_pod_env(docs, deployment))
        grace = _pod(deployment)["terminationGracePeriodSeconds"]
        assert grace > settings.hard_time_limit, f"worker-{target}: a draining job would be killed"


def test_resources_are_requested_and_limited(docs: dict[str, list[dict[str, Any]]]) -> None:
    for workload in (d for d in _all(docs) if d["kind"] in WORKLOADS):
        for container in _pod(workload)["containers"]:
            resources = container["resources"]
            assert {"cpu", "memory"} <= set(resources["requests"]), workload["metadata"]["name"]
            assert "memory" in resources["limits"], workload["metadata"]["name"]


def test_blobs_live_on_one_shared_rwx_claim(docs: dict[str, list[dict[str, Any]]]) -> None:
    claims = set()
    for deployment in [_one(docs, "Deployment", "autofusion-api"), *_workers(docs).values()]:
        pod = _pod(deployment)
        settings = settings_from_env(_pod_env(docs, deployment))
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in pod["containers"][0]["volumeMounts"]}
        assert set(mounts.values()) <= set(volumes)
        data_volume = volumes[mounts[str(settings.data_dir)]]
        claims.add(data_volume["persistentVolumeClaim"]["claimName"])
        assert PurePosixPath(settings.kernel_cache_dir).is_relative_to(PurePosixPath(settings.data_dir))
    (claim,) = claims
    assert _one(docs, "PersistentVolumeClaim", claim)["spec"]["accessModes"] == ["ReadWriteMany"]


def test_every_autofusion_variable_is_a_settings_field(docs: dict[str, list[dict[str, Any]]]) -> None:
    names = settings_env_names()
    for doc in _all(docs, "ConfigMap") + _all(docs, "Secret"):
        keys = set(doc.get("data", {})) | set(doc.get("stringData", {}))
        unknown = {k for k in keys if k.startswith(env_prefix())} - names
        assert not unknown, f"{doc['metadata']['name']}: the service never reads {sorted(unknown)}"
    for workload in (d for d in _all(docs) if d["kind"] in WORKLOADS):
        for container in _pod(workload)["containers"]:
            explicit = {e["name"] for e in container.get("env", [])}
            assert {k for k in explicit if k.startswith(env_prefix())} <= names


def test_settings_are_valid_and_point_at_the_redis_statefulset(docs: dict[str, list[dict[str, Any]]]) -> None:
    (redis,) = _all(docs, "StatefulSet")
    redis_hosts = {
        f"{redis['metadata']['name']}-0.{redis['spec']['serviceName']}",  # the pod's stable name
        redis["spec"]["serviceName"],
    }
    for deployment in [_one(docs, "Deployment", "autofusion-api"), *_workers(docs).values()]:
        settings = settings_from_env(_pod_env(docs, deployment))
        assert not settings.embedded
        host = urlparse(settings.redis_url).hostname or ""
        short = host.removesuffix(".svc.cluster.local").removesuffix(f".{NAMESPACE}")
        assert short in redis_hosts, host


def test_pods_run_as_non_root(docs: dict[str, list[dict[str, Any]]]) -> None:
    for workload in (d for d in _all(docs) if d["kind"] in WORKLOADS):
        assert _pod(workload)["securityContext"]["runAsNonRoot"] is True, workload["metadata"]["name"]
        for container in _pod(workload)["containers"]:
            assert container["securityContext"]["allowPrivilegeEscalation"] is False


def test_accelerator_workers_take_one_device_each(docs: dict[str, list[dict[str, Any]]]) -> None:
    """A Triton target's pod asks the device plugin for its accelerator: without one, its worker
    would refuse to start (exit 3), so the scheduler must place it where the device is."""
    workers = _workers(docs)
    resource = {"cuda": "nvidia.com/gpu", "ascend910": "huawei.com/Ascend910"}
    for target, name in resource.items():
        assert TARGETS[target].compiles and TARGETS[target].backend == "triton"
        (container,) = _pod(workers[target])["containers"]
        assert int(container["resources"]["limits"][name]) == 1, target
        assert container["image"].startswith(f"graph-autofusion-worker-{target}:"), target
    assert "nvidia.com/gpu" not in str(_pod(workers["cpu"]))
