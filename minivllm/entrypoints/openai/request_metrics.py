"""vLLM's per-request timings (``--enable-per-request-metrics``): what one request's engine timestamps say of its
latency, in the response (and in a stream's usage chunk), in milliseconds.

The times are the engine's phases of the request (``RequestOutput.phase_times``). As vLLM: the time to first
token is the prefill phase (from first scheduled), the generation time the decode phase, the mean inter-token
latency the decode phase over the tokens after the first, and the throughput counts every generated token over
the inference phase (prefill and decode). Only requests of one completion report them (the timestamps belong to
the request, not to one of its ``n`` completions)."""

from __future__ import annotations

from minivllm.entrypoints.openai import responses as R
from minivllm.outputs import RequestOutput


def request_metrics(out: RequestOutput | None, num_generated: int) -> R.PerRequestMetrics:
    """The timings of a finished request that generated ``num_generated`` tokens; a timing whose timestamps the
    request lacks (it never got a token) is left out."""
    if out is None:
        return R.PerRequestMetrics()
    t = out.phase_times()

    def ms(seconds: float | None) -> float | None:
        return None if seconds is None else seconds * 1000.0

    metrics = R.PerRequestMetrics(time_to_first_token_ms=ms(t.prefill), generation_time_ms=ms(t.decode),
                                  queue_time_ms=ms(t.queue))
    if t.decode is not None and num_generated > 1:
        metrics.mean_itl_ms = ms(t.decode) / (num_generated - 1)
    if t.inference:
        metrics.tokens_per_second = num_generated / t.inference
    return metrics
