"""``generate``: the batch API on top of ``add_request`` / ``step`` (a mixin of LLMEngine)."""

from __future__ import annotations

from minivllm.engine.tokenizer import chat_template_args
from minivllm.outputs import RequestOutput, StepStats
from minivllm.sampling_params import SamplingParams


class GenerateMixin:
    """Adds ``generate`` and ``chat`` to an engine with ``tokenizer``, ``_tokenize``, ``_validate``, ``_add``,
    ``step`` and ``abort_request``."""

    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[dict]:
        """Generate for a batch; returns ``[{"text", "token_ids", "finish_reason", ...}]`` in prompt order."""
        prompts, sampling_params = batch_of_prompts(prompts, sampling_params)
        encoded = [self._tokenize(p, sp) for p, sp in zip(prompts, sampling_params)]
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

    def chat(self, messages: list[dict] | list[list[dict]], sampling_params: SamplingParams | list[SamplingParams]
             | None = None, use_tqdm: bool = True, chat_template: str | None = None, add_generation_prompt: bool = True,
             continue_final_message: bool = False, chat_template_kwargs: dict | None = None) -> list[dict]:
        """``generate`` on conversations (one, or a list of them) rendered by the chat template, as vLLM's
        ``LLM.chat``: the tokenizer's template, or ``chat_template``, with ``chat_template_kwargs`` (such as
        ``enable_thinking``). ``continue_final_message`` continues the last (assistant) message instead of
        starting a new one."""
        if self.tokenizer is None:
            raise ValueError("chat needs a tokenizer, and this checkpoint has none")
        if not chat_template and not getattr(self.tokenizer, "chat_template", None):
            raise ValueError("chat_template is needed: this model's tokenizer has none")
        conversations = batch_of_conversations(messages)
        prompts = [self.tokenizer.apply_chat_template(c, tokenize=False, **chat_template_args(
            add_generation_prompt, continue_final_message, chat_template, chat_template_kwargs,
            c[-1].get("role") if c else None)) for c in conversations]
        ids = [self.tokenizer.encode(p, add_special_tokens=False) for p in prompts]
        return self.generate(ids, sampling_params, use_tqdm=use_tqdm)


def batch_of_prompts(prompts, sampling_params) -> tuple[list, list[SamplingParams]]:
    """``generate``'s arguments as lists of equal length: one prompt (a string or token ids) or a list of them,
    and one ``SamplingParams`` (None: the defaults) or one per prompt (ValueError if the counts differ)."""
    if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
        prompts = [prompts]
    prompts = list(prompts)
    if sampling_params is None:
        sampling_params = SamplingParams()
    if isinstance(sampling_params, SamplingParams):
        sampling_params = [sampling_params] * len(prompts)
    if len(sampling_params) != len(prompts):
        raise ValueError(f"got {len(sampling_params)} sampling params for {len(prompts)} prompts")
    return prompts, list(sampling_params)


def batch_of_conversations(messages: list[dict] | list[list[dict]]) -> list[list[dict]]:
    """``chat``'s ``messages``, one conversation or a list of them, as a list of conversations."""
    return [messages] if messages and isinstance(messages[0], dict) else list(messages)


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
