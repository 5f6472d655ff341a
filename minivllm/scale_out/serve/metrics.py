"""``/metrics`` across engine replicas: each replica posts its own metrics to one board, the front merges them.

Every sample keeps its vLLM name and labels and gains ``replica="<id>"`` (Serve's replica id), so dashboards
built for vLLM sum over replicas, and a router or autoscaler can read each one. A replica that stopped posting
(it died, or was scaled down) drops out after ``ttl_s``.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families


def merge_replica_metrics(texts: dict[str, bytes]) -> bytes:
    """One Prometheus text of several replicas' (``{replica id: text}``), each sample labelled ``replica``."""
    merged: dict[str, Metric] = {}
    for replica, text in sorted(texts.items()):
        for family in text_string_to_metric_families(text.decode()):
            into = merged.setdefault(family.name, Metric(family.name, family.documentation, family.type))
            for s in family.samples:
                into.add_sample(s.name, {**s.labels, "replica": replica}, s.value, s.timestamp)

    class _Merged:
        def collect(self):
            return list(merged.values())

    registry = CollectorRegistry()
    registry.register(_Merged())
    return generate_latest(registry)


def replicas_load(texts: dict[str, bytes]) -> dict[str, float]:
    """The ORCA load report (``endpoint-load-metrics``) of several replicas' metrics: their mean KV cache usage
    and their waiting sequences in all."""
    usage, waiting = [], 0.0
    for text in texts.values():
        for family in text_string_to_metric_families(text.decode()):
            for s in family.samples:
                if s.name == "vllm:kv_cache_usage_perc":
                    usage.append(s.value)
                elif s.name == "vllm:num_requests_waiting":
                    waiting += s.value
    return {"kv_cache_usage_perc": sum(usage) / len(usage) if usage else 0.0, "num_requests_waiting": waiting}


class MetricsBoard:
    """The replicas' latest metrics (a Serve deployment of one replica): ``post`` from replicas, ``collect`` for
    the front."""

    def __init__(self, ttl_s: float = 10.0):
        self.ttl_s = ttl_s
        self._texts: dict[str, tuple[float, bytes]] = {}

    def post(self, replica: str, text: bytes) -> None:
        """A replica's metrics now."""
        self._texts[replica] = (time.monotonic(), text)

    def remove(self, replica: str) -> None:
        """A replica that shuts down."""
        self._texts.pop(replica, None)

    def collect(self) -> dict[str, bytes]:
        """``{replica id: metrics text}`` of the replicas that posted within ``ttl_s``."""
        now = time.monotonic()
        for r in [r for r, (t, _) in self._texts.items() if now - t > self.ttl_s]:
            del self._texts[r]
        return {r: text for r, (_, text) in self._texts.items()}


class FrontMetrics:
    """The front's own metrics: live replicas and requests retried after their replica died."""

    def __init__(self, model_name: str):
        self.registry = CollectorRegistry()
        self.replicas = Gauge("minivllm_num_replicas", "Engine replicas that posted metrics recently.",
                              ["model_name"], registry=self.registry).labels(model_name)
        self.retries = Counter("minivllm_replica_retries", "Requests sent again to another replica because theirs "
                               "died before they streamed anything.", ["model_name"],
                               registry=self.registry).labels(model_name)

    def render(self, texts: dict[str, bytes]) -> bytes:
        """The merged replica metrics, then the front's."""
        self.replicas.set(len(texts))
        return merge_replica_metrics(texts) + generate_latest(self.registry)
