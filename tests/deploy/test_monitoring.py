"""The Prometheus scrape configs and the Grafana dashboard, against what the API really exports.

The exported names come from the service's own collector rendering a real (SQLite) job store that
a worker heartbeat, a stage observation and a kernel compilation's cache counts were written to.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_files import REPO, app_serves, k8s_documents, load_compose
from prometheus_client.parser import text_string_to_metric_families

from autofusion_core.settings import Settings
from autofusion_core.store import WorkerInfo, open_store
from autofusion_service.metrics import STAGE_METRIC, render
from autofusion_worker.pipeline import _count_cache

PROMETHEUS = REPO / "deploy" / "prometheus"
DASHBOARD = REPO / "deploy" / "grafana" / "dashboard.json"
SUFFIXES = {
    "gauge": ("",),
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
}
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset"}
PROMQL_WORDS |= {"and", "or", "unless", "inf", "nan"}


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, set[str]]]:
    """Sample name → (its family, its label names), as GET /metrics renders them."""
    store = open_store(Settings(data_dir=tmp_path_factory.mktemp("metrics")))
    store.heartbeat(WorkerInfo(id="w", hostname="h", pid=1, targets=["cpu"], last_seen=0.0), ttl=1e12)
    store.observe(STAGE_METRIC, 0.2, stage="planning")
    _count_cache(store, {"hits": 3, "misses": 1})
    text = render(store).decode()
    store.close()
    names: dict[str, tuple[str, set[str]]] = {}
    for family in text_string_to_metric_families(text):
        for suffix in SUFFIXES[family.type]:
            names.setdefault(family.name + suffix, (family.name, set()))
        for sample in family.samples:
            names.setdefault(sample.name, (family.name, set()))[1].update(sample.labels)
    return names


def _expressions(dashboard: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", []) if t.get("expr")]
    for var in dashboard.get("templating", {}).get("list", []):
        query = var.get("query")
        if var["type"] == "query":
            exprs.append(query["query"] if isinstance(query, dict) else query)
    return exprs


def _names_in(expr: str) -> tuple[set[str], set[str]]:
    """(metric names, label names) a PromQL expression (or Grafana `label_values()`) uses."""
    metrics: set[str] = set()
    labels: set[str] = set()
    for metric, label in re.findall(r"label_values\(\s*(\w+)\s*,\s*(\w+)\s*\)", expr):
        metrics.add(metric)
        labels.add(label)
    expr = re.sub(r"label_values\([^)]*\)", " ", expr)
    for matchers in re.findall(r"\{([^}]*)\}", expr):
        labels |= set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", matchers))
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\"[^\"]*\"", " ", expr)
    for grouping in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", expr):
        labels |= {w.strip() for w in grouping.split(",") if w.strip()}
    expr = re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", " ", expr)
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", expr):
        word, rest = match.group(0), expr[match.end() :]
        if word.lower() in PROMQL_WORDS or re.match(r"\s*\(", rest):
            continue  # a keyword or a function call
        metrics.add(word)
    return metrics, labels


def test_dashboard_queries_only_what_the_service_exports(exported: dict[str, tuple[str, set[str]]]) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = _expressions(dashboard)
    assert len(exprs) >= 5
    shown: set[str] = set()
    for expr in exprs:
        metrics, labels = _names_in(expr)
        assert metrics, f"no metric in {expr!r}"
        assert metrics <= set(exported), f"{expr!r} uses {sorted(metrics - set(exported))}"
        known = {"le"}.union(*(exported[m][1] for m in metrics))
        assert labels <= known, f"{expr!r} uses labels {sorted(labels - known)}"
        shown |= {exported[m][0] for m in metrics}
    families = {family for family, _ in exported.values()}
    assert shown == families, f"exported but not on the dashboard: {sorted(families - shown)}"


def test_dashboard_is_portable_grafana_json() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] and dashboard["panels"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    # Panels use the dashboard's data-source variable, so the file works wherever it is imported.
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]


def test_the_name_extraction_sees_metrics_and_labels() -> None:
    metrics, labels = _names_in(
        'histogram_quantile(0.95, max by (le, stage) (rate(x_bucket{target=~"$t"}[5m]))) / y'
    )
    assert metrics == {"x_bucket", "y"} and labels == {"le", "stage", "target"}


def _scrape_jobs(path: Path) -> list[dict[str, Any]]:
    return yaml.safe_load(path.read_text())["scrape_configs"]


def test_compose_prometheus_scrapes_the_api_service() -> None:
    compose = load_compose()
    (job,) = _scrape_jobs(PROMETHEUS / "prometheus.yml")
    assert app_serves(job["metrics_path"]) and job["metrics_path"] == "/metrics"
    (static,) = job["static_configs"]
    for target in static["targets"]:
        host, port = target.split(":")
        assert host in compose["services"]
        assert any(p.endswith(f":{port}") for p in compose["services"][host]["ports"])
    mounted = [v for v in compose["services"]["prometheus"]["volumes"] if "prometheus.yml" in v]
    assert mounted and (REPO / mounted[0].split(":")[0]).resolve() == (PROMETHEUS / "prometheus.yml")


def test_k8s_prometheus_keeps_the_api_service_port() -> None:
    (job,) = _scrape_jobs(PROMETHEUS / "prometheus-k8s.yml")
    assert app_serves(job["metrics_path"])
    (keep,) = [r for r in job["relabel_configs"] if r.get("action") == "keep"]
    service_name, port_name = keep["regex"].split(";")
    services = [d for docs in k8s_documents().values() for d in docs if d["kind"] == "Service"]
    (service,) = [s for s in services if s["metadata"]["name"] == service_name]
    assert port_name in {p["name"] for p in service["spec"]["ports"]}
    (sd,) = job["kubernetes_sd_configs"]
    assert sd["namespaces"]["names"] == [service["metadata"]["namespace"]]


def test_the_deploy_guide_lists_every_exported_family(exported: dict[str, tuple[str, set[str]]]) -> None:
    guide = (REPO / "docs" / "deploy.md").read_text()
    for family in {f for f, _ in exported.values()}:
        # a counter is queried (and documented) by its `_total` sample name
        spelled = (f"`{family}`", f"`{family}_total`")
        assert any(s in guide for s in spelled), f"docs/deploy.md does not list {family}"
