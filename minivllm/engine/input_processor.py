"""Checking and tokenizing what a caller submits (a mixin of LLMEngine): prompts as text or token ids, and the
request's parameters against this engine's model and tokenizer."""

from __future__ import annotations

from minivllm.sampling_params import SamplingParams


class InputProcessorMixin:
    """``_tokenize`` and ``_validate`` for an engine with ``tokenizer``, ``config`` and ``structured`` (its
    ``StructuredOutputManager``, None without a tokenizer)."""

    def _tokenize(self, prompt: str | list[int], params: SamplingParams | None = None) -> tuple[str | None, list[int]]:
        """``(text or None, token ids)`` of a prompt, cut to its last ``params.truncate_prompt_tokens`` (as vLLM)."""
        text, ids = self._encode(prompt)
        if params is not None and params.truncate_prompt_tokens is not None:
            ids = ids[-params.truncate_prompt_tokens:]
        return text, ids

    def _encode(self, prompt: str | list[int]) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this checkpoint has no tokenizer: pass prompts as lists of token ids")
            try:
                prompt.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise ValueError(f"prompt is not valid Unicode text (a lone UTF-16 surrogate at character "
                                 f"{exc.start})") from None
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return None, list(prompt)
        raise ValueError(f"a prompt must be a string or a list of token ids, got {type(prompt).__name__}")

    def _validate(self, token_ids: list[int], params: SamplingParams) -> None:
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling_params must be a SamplingParams, got {type(params).__name__}")
        if not token_ids:
            raise ValueError("the prompt is empty: it must have at least one token")
        max_len = self.config.model_config.max_model_len
        if len(token_ids) >= max_len:  # NOTE: before the walk over the ids below
            raise ValueError(f"the prompt has {len(token_ids)} tokens, but max_model_len is {max_len}: "
                             f"it must be shorter to leave room for at least one generated token")
        vocab = self.config.model_config.arch.vocab_size
        bad = next((t for t in token_ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad} is outside the vocabulary [0, {vocab})")
        for name, ids in (("logit_bias", params.logit_bias or ()), ("allowed_token_ids", params.allowed_token_ids or ())):
            bad = next((t for t in ids if t >= vocab), None)
            if bad is not None:
                raise ValueError(f"{name} has token id {bad}, outside the vocabulary [0, {vocab})")
        if params.bad_words and self.tokenizer is None:
            raise ValueError("bad_words needs a tokenizer, and this checkpoint has none")
        if params.structured_outputs is not None:
            if self.structured is None:
                raise ValueError("structured_outputs needs a tokenizer, and this checkpoint has none")
            self.structured.validate(params.structured_outputs)
        if params.max_tokens is not None and params.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {params.max_tokens}")
        if params.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {params.temperature}")
