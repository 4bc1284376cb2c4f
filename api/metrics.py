"""The Prometheus exposition of the fleet's metrics (``GET /metrics``).

Metrics are counted in Redis by whichever process sees the event
(``orchestrator/storage/metrics.py``);
this collector reads them at scrape time, so one scrape of any API process shows the whole
fleet. When Redis cannot be read, only ``fleet_store_up 0`` is exposed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from orchestrator.errors import StoreUnavailable
from orchestrator.storage import metrics
from orchestrator.storage.store import Store

#: Content type of the text exposition format.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class FleetCollector(Collector):
    """Reads every metric from Redis at each ``collect`` (one pipelined round trip)."""

    def __init__(self, store: Callable[[], Store]) -> None:
        self._store = store

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("fleet_store_up", "Whether Redis answered this scrape (1 or 0).")
        try:
            snap = metrics.snapshot(self._store())
        except StoreUnavailable:
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        for counter in metrics.COUNTERS:
            family = CounterMetricFamily(counter.name, counter.help, labels=list(counter.labels))
            for labels, value in sorted(snap.counters[counter.name].items()):
                family.add_metric(list(labels), value)
            yield family
        for histogram in metrics.HISTOGRAMS:
            read = snap.histograms[histogram.name]
            family_h = HistogramMetricFamily(histogram.name, histogram.help)
            family_h.add_metric(
                [],
                [(_le(bound), count) for bound, count in read.buckets],
                sum_value=read.sum,
            )
            yield family_h
        sessions = GaugeMetricFamily(
            "fleet_sessions",
            "Sessions in each listing state (active: not archived; deleted ones excluded).",
            labels=["state"],
        )
        for state, count in sorted(snap.sessions.items()):
            sessions.add_metric([state], count)
        yield sessions


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


def registry(store: Callable[[], Store]) -> CollectorRegistry:
    """A registry holding only the fleet collector (no process metrics: they would describe
    one API process, not the fleet)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(FleetCollector(store))
    return reg


def render(reg: CollectorRegistry) -> bytes:
    """The text exposition of ``reg``."""
    return generate_latest(reg)
