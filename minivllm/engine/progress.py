"""The offline progress bar: prompts finished, with the prefill and decode tokens per second."""

from __future__ import annotations

import time

from minivllm.outputs import StepStats

REDRAW_S = 0.5
"""Longest time, in seconds, the bar goes without a redraw while no prompt finishes."""


class ThroughputMeter:
    """Prefill and decode tokens per second over the wall time of the steps that did each. Decode tokens are
    the generated ones: with speculative decoding, a step's rejected drafts are computed but not counted."""

    def __init__(self):
        self.tokens = {"prefill": 0, "decode": 0}
        self.time = {"prefill": 0.0, "decode": 0.0}

    def update(self, stats: StepStats) -> str:
        """Count one step; the rates so far, as the progress bar's postfix."""
        total = stats.num_prefill_tokens + stats.num_decode_tokens
        rejected = stats.spec_num_draft_tokens - stats.spec_num_accepted_tokens
        for key, n, counted in (("prefill", stats.num_prefill_tokens, stats.num_prefill_tokens),
                                ("decode", stats.num_decode_tokens, max(0, stats.num_decode_tokens - rejected))):
            if n:  # a mixed step's time is shared in proportion to its tokens
                self.tokens[key] += counted
                self.time[key] += stats.step_time * n / total
        rate = {k: self.tokens[k] / self.time[k] if self.time[k] else 0.0 for k in self.tokens}
        return f"prefill={rate['prefill']:.0f}tok/s, decode={rate['decode']:.0f}tok/s"


class BatchProgress:
    """The bar of one offline batch ("Processed prompts", tqdm on stderr): one tick per finished prompt, the
    rates so far as its postfix. It redraws at least every ``REDRAW_S`` whether or not a prompt finished, so a
    batch whose prompts all finish together (a fixed-size benchmark) shows its elapsed time and rates moving
    instead of a bar frozen at 0 until the end."""

    def __init__(self, total: int):
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, desc="Processed prompts", dynamic_ncols=True)
        self.rates = ThroughputMeter()
        self.drawn = time.monotonic()

    def step(self, stats: StepStats, finished: int) -> None:
        """Count one engine step, in which ``finished`` prompts of the batch finished."""
        self.bar.set_postfix_str(self.rates.update(stats), refresh=False)
        if finished:
            self.bar.update(finished)
        now = time.monotonic()
        if now - self.drawn >= REDRAW_S:
            self.bar.refresh()
            self.drawn = now

    def close(self) -> None:
        """Draw the last state and release the terminal line."""
        self.bar.close()
