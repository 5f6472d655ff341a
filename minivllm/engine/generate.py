"""``generate``: the batch API on top of ``add_request`` / ``step`` (a mixin of LLMEngine)."""

from __future__ import annotations

from minivllm.outputs import RequestOutput, StepStats
from minivllm.sampling_params import SamplingParams


class GenerateMixin:
    """Adds ``generate`` to an engine with ``_tokenize``, ``_validate``, ``_add``, ``step`` and ``abort_request``."""

    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[dict]:
        """Generate for a batch; returns ``[{"text", "token_ids", "finish_reason", ...}]`` in prompt order."""
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError(f"got {len(sampling_params)} sampling params for {len(prompts)} prompts")
        encoded = [self._tokenize(p) for p in prompts]
        for (_, ids), sp in zip(encoded, sampling_params):
            self._validate(ids, sp)
        ids = [self._add(text, tok, sp) for (text, tok), sp in zip(encoded, sampling_params)]
        results: dict[str, RequestOutput] = {}
        pbar = None
        if use_tqdm:
            from tqdm.auto import tqdm

            pbar = tqdm(total=len(prompts), desc="Processed prompts", dynamic_ncols=True)
        rates = _ThroughputMeter()
        try:
            pending = set(ids)
            while pending:
                outputs, stats = self.step()
                if pbar is not None:
                    pbar.set_postfix_str(rates.update(stats), refresh=False)
                for o in outputs:
                    if o.finished and o.request_id in pending:
                        results[o.request_id] = o
                        pending.discard(o.request_id)
                        if pbar is not None:
                            pbar.update(1)
        except BaseException:
            for rid in ids:
                self.abort_request(rid)
            raise
        finally:
            if pbar is not None:
                pbar.close()
        return [results[rid].to_dict() for rid in ids]


class _ThroughputMeter:
    """Prefill and decode tokens per second over the wall time of the steps that did each."""

    def __init__(self):
        self.tokens = {"prefill": 0, "decode": 0}
        self.time = {"prefill": 0.0, "decode": 0.0}

    def update(self, stats: StepStats) -> str:
        total = stats.num_prefill_tokens + stats.num_decode_tokens
        for key, n in (("prefill", stats.num_prefill_tokens), ("decode", stats.num_decode_tokens)):
            if n:  # a mixed step's time is shared in proportion to its tokens
                self.tokens[key] += n
                self.time[key] += stats.step_time * n / total
        rate = {k: self.tokens[k] / self.time[k] if self.time[k] else 0.0 for k in self.tokens}
        return f"prefill={rate['prefill']:.0f}tok/s, decode={rate['decode']:.0f}tok/s"
