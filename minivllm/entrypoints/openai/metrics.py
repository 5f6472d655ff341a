"""Prometheus metrics of the server: engine load, token counters and request latency histograms, under vLLM's
names (``vllm:num_requests_running``, ...) where vLLM has the metric, ``minivllm_*`` for the others.

``PrometheusStatLogger`` is an engine client's stat logger (``engine/protocol.py``'s ``StatLogger``): the engine
loop thread calls it after each step and on each abort (prometheus_client metrics are thread-safe). Each logger owns its own
``CollectorRegistry``, so several apps (tests) never share or clash on the global one.
"""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from minivllm.outputs import RequestOutput, StepStats

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                   10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)  # vLLM's
# vLLM's buckets of a request's phases (queue, prefill, decode, inference), its n and its preemptions
PHASE_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                 480.0, 960.0, 1920.0, 7680.0)
PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
PREEMPTION_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
#: vLLM's reasons a request is turned away at admission; this server's one limit is on waiting sequences
#: (--max-num-waiting, a 429), counted as max_num_queued_reqs
ADMISSION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")
#: vLLM's finish reasons: each ``vllm:request_success`` series exists from the start, at 0 (a dashboard's
#: ``rate()`` of aborts reads 0, not "no data"); this engine ends requests with the first three
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
#: attribute -> (name, help), each labelled by model name: vLLM's names where vLLM has the metric (dashboards and
#: autoscalers built for vLLM read them unchanged), ``minivllm_`` for the ones of our own
_LOAD_GAUGES = {
    "num_running": ("vllm:num_requests_running", "Sequences in the running batch."),
    "num_waiting": ("vllm:num_requests_waiting", "Sequences waiting to be scheduled."),
    "max_running": ("minivllm_num_requests_running_max", "Most sequences seen in one engine step."),
}
_CACHE_GAUGES = {
    "kv_usage": ("vllm:kv_cache_usage_perc", "Fraction of KV cache blocks in use (ref count > 0), 0 to 1."),
    "kv_blocks_used": ("minivllm_kv_cache_blocks_used", "KV cache blocks in use (ref count > 0)."),
    "kv_blocks_total": ("minivllm_kv_cache_blocks_total", "KV cache blocks in all."),
    "prefix_hit_rate": ("minivllm_prefix_cache_hit_rate", "Prefix cache hits / queries (tokens), cumulative."),
}
_COUNTERS = {
    "prefix_queries": ("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache."),
    "prefix_hits": ("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache."),
    "prompt_tokens": ("vllm:prompt_tokens", "Prompt tokens of the requests that started."),
    "generation_tokens": ("vllm:generation_tokens", "Generated tokens."),
    "preemptions": ("vllm:num_preemptions", "Sequences preempted (their KV cache dropped)."),
    # speculative decoding (vLLM's): acceptance rate = accepted / draft tokens; mean acceptance length =
    # 1 + accepted / drafts
    "spec_drafts": ("vllm:spec_decode_num_drafts", "Rows that verified drafts (speculative decoding)."),
    "spec_draft_tokens": ("vllm:spec_decode_num_draft_tokens", "Draft tokens verified."),
    "spec_accepted_tokens": ("vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted."),
}


class PrometheusStatLogger:
    """Keeps the server's Prometheus metrics up to date from the engine loop's outputs and stats."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, model_name: str, registry: CollectorRegistry | None = None):
        self.registry = registry if registry is not None else CollectorRegistry()
        r, names = self.registry, ["model_name"]

        for kind, table in ((Gauge, _LOAD_GAUGES), (Gauge, _CACHE_GAUGES), (Counter, _COUNTERS)):
            for attr, (name, doc) in table.items():
                setattr(self, attr, kind(name, doc, names, registry=r).labels(model_name))

        def histogram(name, doc, buckets=LATENCY_BUCKETS):
            return Histogram(name, doc, names, buckets=buckets, registry=r).labels(model_name)

        self._accepted_per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "Draft tokens accepted at "
                                         "each draft position (0: the first draft of a row).",
                                         names + ["position"], registry=r)
        self._success = Counter("vllm:request_success", "Requests that ended, by finish reason.",
                                names + ["finished_reason"], registry=r)
        for reason in FINISH_REASONS:
            self._success.labels(model_name, reason)
        self.iteration_tokens = histogram(
            "vllm:iteration_tokens_total", "Tokens per engine step that produced outputs: the prompts of the requests "
            "that got their first token in it, and the tokens it generated (vLLM's count).", ITERATION_TOKEN_BUCKETS)
        # vLLM's reasons: "capacity" (waiting for room in the batch or the KV cache) and "deferred" (held by a
        # transient constraint); this scheduler holds none, so every waiting sequence waits for capacity
        waiting = Gauge("vllm:num_requests_waiting_by_reason", "Sequences waiting to be scheduled, by reason "
                        "(capacity, deferred); they add up to vllm:num_requests_waiting.", names + ["reason"],
                        registry=r)
        self.waiting_capacity = waiting.labels(model_name, "capacity")
        waiting.labels(model_name, "deferred")  # stays 0
        self._load: dict[str, float] = {"kv_cache_usage_perc": 0.0, "num_requests_waiting": 0.0}
        self._model = model_name
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Arrival to first generated token.")
        self.itl = histogram("vllm:inter_token_latency_seconds", "Time between two tokens of one completion.")
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Arrival to the end of the request.")
        self._admission = Counter("vllm:admission_rejections", "Requests turned away at admission (429: too many "
                                  "sequences waiting), by reason.", names + ["reason"], registry=r)
        for reason in ADMISSION_REASONS:  # each series exists from the start, at 0
            self._admission.labels(model_name, reason)
        phase = "Time of a finished request in its {} phase (vLLM's)."
        self.queue_time = histogram("vllm:request_queue_time_seconds", phase.format("waiting"), PHASE_BUCKETS)
        self.prefill_time = histogram("vllm:request_prefill_time_seconds", phase.format("prefill"), PHASE_BUCKETS)
        self.decode_time = histogram("vllm:request_decode_time_seconds", phase.format("decode"), PHASE_BUCKETS)
        self.inference_time = histogram("vllm:request_inference_time_seconds", phase.format("running (prefill and "
                                        "decode)"), PHASE_BUCKETS)
        self.request_preemptions = histogram("vllm:request_num_preemptions", "Times a finished request's sequences "
                                             "were preempted.", PREEMPTION_BUCKETS)
        self.params_n = histogram("vllm:request_params_n", "The n of finished requests.", PARAMS_N_BUCKETS)
        # the token-count histograms' buckets reach max_model_len: made once the engine tells it (on_cache_config)
        self._token_histograms: tuple | None = None
        self._histogram = histogram
        self.batch_size = histogram("minivllm_batch_size", "Sequences in each engine step that ran the model.", BATCH_BUCKETS)
        self.step_time = histogram("minivllm_step_time_seconds", "Wall time of each engine step that ran the model.")
        self._hits = self._queries = 0
        self._peak = 0
        self._started: set[str] = set()
        self._last_token: dict[tuple[str, int], float] = {}

    def on_cache_config(self, block_size: int, num_gpu_blocks: int, max_model_len: int) -> None:
        """vLLM's ``vllm:cache_config_info`` (value 1, the settings as labels: the block size and count, the
        tokens they hold and how many requests of ``max_model_len`` tokens fit), once the engine is ready: routers
        that score prefix-cache hits themselves, such as llm-d's endpoint picker, read them. Also makes the
        per-request token histograms, whose buckets reach ``max_model_len``."""
        tokens = block_size * num_gpu_blocks
        Gauge("vllm:cache_config_info", "The KV cache's settings (as labels).", [
            "model_name", "block_size", "num_gpu_blocks", "kv_cache_size_tokens", "kv_cache_max_concurrency"],
            registry=self.registry).labels(self._model, str(block_size), str(num_gpu_blocks), str(tokens),
                                           f"{tokens / max_model_len:.2f}").set(1)
        if self._token_histograms is None:
            buckets = tokens_buckets(max_model_len)
            self._token_histograms = tuple(self._histogram(name, doc, buckets) for name, doc in (
                ("vllm:request_prompt_tokens", "Prompt tokens of finished requests."),
                ("vllm:request_generation_tokens", "Generated tokens of finished requests (all their completions)."),
                ("vllm:request_params_max_tokens", "The max_tokens of finished requests.")))

    def on_admission_rejection(self, reason: str = "max_num_queued_reqs") -> None:
        """A request turned away at admission (``vllm:admission_rejections``)."""
        self._admission.labels(self._model, reason).inc()

    def on_step(self, outputs: list[RequestOutput], stats: StepStats, now: float) -> None:
        """Record one engine step: gauges from ``stats``, counters and latencies from ``outputs``."""
        self.num_running.set(stats.num_running)
        self.num_waiting.set(stats.num_waiting)
        self.waiting_capacity.set(stats.num_waiting)
        self.kv_usage.set(stats.kv_cache_usage)
        self._load = {"kv_cache_usage_perc": float(stats.kv_cache_usage),
                      "num_requests_waiting": float(stats.num_waiting)}
        self.kv_blocks_used.set(stats.kv_blocks_used)
        self.kv_blocks_total.set(stats.kv_blocks_total)
        if stats.num_preempted:
            self.preemptions.inc(stats.num_preempted)
        if stats.spec_num_drafts:
            self.spec_drafts.inc(stats.spec_num_drafts)
            self.spec_draft_tokens.inc(stats.spec_num_draft_tokens)
            self.spec_accepted_tokens.inc(stats.spec_num_accepted_tokens)
            for pos, n in enumerate(stats.spec_accepted_per_pos):
                self._accepted_per_pos.labels(self._model, str(pos)).inc(n)
        if stats.prefix_cache_query_tokens:
            self._queries += stats.prefix_cache_query_tokens
            self._hits += stats.prefix_cache_hit_tokens
            self.prefix_queries.inc(stats.prefix_cache_query_tokens)
            self.prefix_hits.inc(stats.prefix_cache_hit_tokens)
            self.prefix_hit_rate.set(self._hits / self._queries)
        if stats.num_scheduled_seqs:
            self.batch_size.observe(stats.num_scheduled_seqs)
            self.step_time.observe(stats.step_time)
            self._peak = max(self._peak, stats.num_scheduled_seqs)
            self.max_running.set(self._peak)
        if outputs:
            self.iteration_tokens.observe(sum(self._on_output(out, now) for out in outputs))

    def _on_output(self, out: RequestOutput, now: float) -> int:
        """Record one request's output; returns its tokens for ``vllm:iteration_tokens_total``."""
        rid, tokens = out.request_id, 0
        if rid not in self._started:
            self._started.add(rid)
            tokens += len(out.prompt_token_ids)
            self.prompt_tokens.inc(len(out.prompt_token_ids))
            first = out.first_token_time if out.first_token_time is not None else now
            self.ttft.observe(max(0.0, first - out.arrival_time))
        for c in out.outputs:
            key = (rid, c.index)
            if c.delta_token_ids:
                tokens += len(c.delta_token_ids)
                self.generation_tokens.inc(len(c.delta_token_ids))
                last = self._last_token.get(key)
                if last is not None:
                    self.itl.observe(now - last)
                self._last_token[key] = now
            if c.finished:
                self._last_token.pop(key, None)
        if out.finished:
            self._started.discard(rid)
            end = out.finished_time if out.finished_time is not None else now
            self.e2e.observe(max(0.0, end - out.arrival_time))
            self._success.labels(self._model, out.outputs[0].finish_reason or "abort").inc()
            self._on_finished(out)
        return tokens

    def _on_finished(self, out: RequestOutput) -> None:
        """vLLM's per-request histograms of a finished request: its phases (0 for one it never reached), its
        preemptions, its n, and its token counts."""
        for hist, seconds in zip((self.queue_time, self.prefill_time, self.decode_time, self.inference_time),
                                 out.phase_times()):
            hist.observe(seconds or 0.0)
        self.request_preemptions.observe(out.num_preemptions)
        self.params_n.observe(len(out.outputs))
        if self._token_histograms is not None:
            prompt, generation, max_tokens = self._token_histograms
            prompt.observe(len(out.prompt_token_ids))
            generation.observe(sum(len(c.token_ids) for c in out.outputs))
            if out.max_tokens:
                max_tokens.observe(out.max_tokens)

    def on_abort(self, request_id: str, now: float) -> None:
        """Count an aborted request and forget its timing state."""
        self._started.discard(request_id)
        for key in [k for k in self._last_token if k[0] == request_id]:
            del self._last_token[key]
        self._success.labels(self._model, "abort").inc()

    def load_report(self) -> dict[str, float]:
        """The ORCA load report's named metrics (vLLM's: KV cache usage and waiting requests) after the latest
        step, for the ``endpoint-load-metrics`` response header."""
        return dict(self._load)

    def render(self) -> bytes:
        """The metrics in the Prometheus text format."""
        return generate_latest(self.registry)


def tokens_buckets(max_value: int) -> list[int]:
    """vLLM's buckets of token counts: 1, 2, 5, 10, 20, 50, ... up to ``max_value``."""
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return out
            out.append(m * scale)
        scale *= 10
