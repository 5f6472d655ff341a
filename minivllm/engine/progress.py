"""The offline progress bar's rates: prefill and decode tokens per second."""

from __future__ import annotations

from minivllm.outputs import StepStats


class ThroughputMeter:
    """Prefill and decode tokens per second over the wall time of the steps that did each."""

    def __init__(self):
        self.tokens = {"prefill": 0, "decode": 0}
        self.time = {"prefill": 0.0, "decode": 0.0}

    def update(self, stats: StepStats) -> str:
        """Count one step; the rates so far, as the progress bar's postfix."""
        total = stats.num_prefill_tokens + stats.num_decode_tokens
        for key, n in (("prefill", stats.num_prefill_tokens), ("decode", stats.num_decode_tokens)):
            if n:  # a mixed step's time is shared in proportion to its tokens
                self.tokens[key] += n
                self.time[key] += stats.step_time * n / total
        rate = {k: self.tokens[k] / self.time[k] if self.time[k] else 0.0 for k in self.tokens}
        return f"prefill={rate['prefill']:.0f}tok/s, decode={rate['decode']:.0f}tok/s"
