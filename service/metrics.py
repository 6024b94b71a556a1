"""Prometheus metrics, read from the job store at scrape time.

Workers run in other processes (and hosts), so they write their observations (stage durations,
kernel cache hits) as counters into the job store; this collector turns the store's state into
Prometheus families. Any API replica therefore exports the same, complete numbers.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from autofusion_core.store import JobStore
from autofusion_core.store.base import STAGE_BUCKETS, parse_counter_key
from autofusion_core.store.records import STATUSES

STAGE_METRIC = "autofusion_stage_duration_seconds"


class StoreCollector:
    def __init__(self, store: JobStore) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        counts = self.store.count_by_status()
        jobs = GaugeMetricFamily("autofusion_jobs", "Jobs in the store by status.", labels=["status"])
        for status in STATUSES:
            jobs.add_metric([status], counts.get(status, 0))
        yield jobs

        workers = self.store.workers()
        served: dict[str, int] = defaultdict(int)
        for worker in workers:
            for target in worker.targets:
                served[target] += 1
        depth = GaugeMetricFamily("autofusion_queue_depth", "Queued jobs per target.", labels=["target"])
        queued = self.store.queued_by_target()
        for target in sorted(set(queued) | set(served)):
            depth.add_metric([target], queued.get(target, 0))
        yield depth
        live = GaugeMetricFamily("autofusion_workers", "Live workers per served target.", labels=["target"])
        for target, n in sorted(served.items()):
            live.add_metric([target], n)
        yield live

        counters = self.store.counters()
        buckets: dict[str, dict[str, float]] = defaultdict(dict)
        sums: dict[str, float] = defaultdict(float)
        cache = CounterMetricFamily(
            "autofusion_kernel_cache", "Kernel cache lookups by result.", labels=["result"]
        )
        for key, value in counters.items():
            name, labels = parse_counter_key(key)
            if name == f"{STAGE_METRIC}_bucket":
                buckets[labels["stage"]][labels["le"]] = value
            elif name == f"{STAGE_METRIC}_sum":
                sums[labels["stage"]] = value
            elif name.startswith("autofusion_kernel_cache_") and name.endswith("_total"):
                cache.add_metric(
                    [name.removeprefix("autofusion_kernel_cache_").removesuffix("_total")], value
                )
        stages = HistogramMetricFamily(STAGE_METRIC, "Duration of pipeline stages.", labels=["stage"])
        for stage, by_le in sorted(buckets.items()):
            series = [(repr(float(b)), by_le.get(repr(float(b)), 0.0)) for b in STAGE_BUCKETS]
            series.append(("+Inf", by_le.get("+Inf", 0.0)))
            stages.add_metric([stage], series, sum_value=sums.get(stage, 0.0))
        yield stages
        yield cache


def render(store: JobStore) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store))
    return generate_latest(registry)
