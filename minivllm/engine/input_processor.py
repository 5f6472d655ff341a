"""InputProcessor (vLLM V1's Processor): checks and tokenizes what a caller submits, once, and copies it.

The engine keeps its own copy of every request's ``SamplingParams``: the caller's object is never changed and
may be reused or changed after the call. What the engine derives from a request (its prompt's token ids, each
bad word's token ids) is kept beside that copy on the ``EngineRequest``, not written into it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace

from minivllm.config import Config
from minivllm.core.thinking_budget import ThinkingBudget
from minivllm.engine.lora_registry import LoRARegistry
from minivllm.engine.structured_output import StructuredOutputManager
from minivllm.engine.tokenizer import bad_words_token_ids
from minivllm.lora.request import LoRARequest
from minivllm.sampling_params import ParameterError, SamplingParams


@dataclass(frozen=True)
class EngineRequest:
    """A checked request, ready for the scheduler: the prompt's text (None when given as token ids) and token
    ids (cut to ``truncate_prompt_tokens`` on ``truncation_side``), the engine's copy of its parameters, and each
    bad word's token ids, and its ``thinking_token_budget`` with the reasoning's markers as token ids, and the
    LoRA adapter it runs with (None: the base model)."""

    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    bad_words_token_ids: tuple[tuple[int, ...], ...] = ()
    thinking_budget: ThinkingBudget | None = None
    lora_request: LoRARequest | None = None


class InputProcessor:
    """Turns ``(prompt, params)`` into an ``EngineRequest`` for one engine's model and tokenizer (None: prompts
    must be token ids); ``structured``: the engine's grammar manager (None without a tokenizer). Raises ValueError
    naming the parameter for any bad input, before the engine changes. ``loras``: the engine's known LoRA
    adapters (a request's adapter is checked there, once)."""

    def __init__(self, config: Config, tokenizer, structured: StructuredOutputManager | None):
        self.tokenizer, self.structured = tokenizer, structured
        self.loras = LoRARegistry(config)
        self.max_model_len = config.model_config.max_model_len
        self.vocab_size = config.model_config.arch.vocab_size
        self.image_token_id = config.model_config.arch.image_token_id  # a multimodal checkpoint's placeholder
        self.max_logprobs = config.model_config.max_num_logprobs
        # the reasoning's markers as token ids (None: no --reasoning-config, or a marker that is empty)
        rc = config.sampling_config.reasoning_config
        self.reasoning_markers = None
        if rc is not None and rc.enabled and tokenizer is not None:
            start, end = (tuple(tokenizer.encode(s, add_special_tokens=False))
                          for s in (rc.reasoning_start_str, rc.reasoning_end_str))
            if not start or not end:
                raise ValueError(f"reasoning_config: the markers {rc.reasoning_start_str!r} and "
                                 f"{rc.reasoning_end_str!r} must each be one token or more")
            self.reasoning_markers = (start, end)

    def process_batch(self, prompts, params, lora_requests=None) -> list[EngineRequest]:
        """Check and tokenize a batch (``params[i]`` and ``lora_requests[i]`` for ``prompts[i]``), every request
        before any is queued."""
        prompts, params = list(prompts), list(params)
        loras = [None] * len(prompts) if lora_requests is None else list(lora_requests)
        if len(loras) != len(prompts) or len(params) != len(prompts):
            raise ValueError(f"lora_request / sampling_params: got {len(loras)} / {len(params)} for "
                             f"{len(prompts)} prompts")
        return [self.process(p, sp, lora_request=lr) for p, sp, lr in zip(prompts, params, loras)]

    def process(self, prompt: str | list[int], params: SamplingParams | None = None,
                strict_length: bool = False, lora_request: LoRARequest | None = None) -> EngineRequest:
        """Check and tokenize one request. ``strict_length`` (the OpenAI server) also rejects a request whose
        prompt plus ``max_tokens`` exceeds ``max_model_len``, instead of cutting it at that length.
        ``lora_request``: the adapter to run with (its folder checked the first time its id is seen)."""
        if params is None:
            params = SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling_params must be a SamplingParams, got {type(params).__name__}")
        # replace() checks the parameters again (the caller may have changed them since they were built);
        # the deep copy shares nothing with the caller's object
        params = copy.deepcopy(replace(params))
        text, token_ids = self._encode(prompt)
        token_ids = params.truncate(token_ids)
        self._validate(token_ids, params)
        if strict_length and params.max_tokens is not None:
            total = len(token_ids) + params.max_tokens
            if total > self.max_model_len:
                raise ValueError(
                    f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                    f"{total} tokens ({len(token_ids)} in the prompt, {params.max_tokens} in the completion). "
                    f"Please reduce the length of the prompt or the completion.")
        words = ()
        if params.bad_words:
            words = tuple(tuple(w) for w in bad_words_token_ids(self.tokenizer, params.bad_words))
        budget = None
        if params.thinking_token_budget is not None:
            if self.reasoning_markers is None:
                raise ParameterError("thinking_token_budget is set but reasoning_config is not configured. Please "
                                     "set --reasoning-parser and/or --reasoning-config to use thinking_token_budget.",
                                     "thinking_token_budget")
            budget = ThinkingBudget(*self.reasoning_markers, params.thinking_token_budget)
        lora = self.loras.resolve(lora_request)
        return EngineRequest(text, token_ids, params, words, budget, lora)

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
        if isinstance(prompt, dict) and prompt.get("multi_modal_data"):  # vLLM's prompt dict with images
            raise ValueError("multi_modal_data: images and other media are not supported (minivllm runs the text "
                             "model only)")
        raise ValueError(f"a prompt must be a string or a list of token ids, got {type(prompt).__name__}")

    def _validate(self, token_ids: list[int], params: SamplingParams) -> None:
        """Raises ParameterError in vLLM's words where clients match on them (an empty prompt, token ids outside
        the vocabulary: every one named), ValueError naming the parameter otherwise."""
        if not token_ids:
            raise ParameterError("The decoder prompt cannot be empty", "prompt")
        max_len = self.max_model_len
        if len(token_ids) >= max_len:  # before the walk over the ids below
            raise ValueError(f"the prompt has {len(token_ids)} tokens, but max_model_len is {max_len}: "
                             f"it must be shorter to leave room for at least one generated token")
        vocab = self.vocab_size
        low, high = min(token_ids), max(token_ids)
        if low < 0 or high >= vocab:  # vLLM names the largest id
            raise ParameterError(f"Token id {high if high >= vocab else low} is out of vocabulary (the model's has "
                                 f"{vocab} tokens)", "prompt")
        if self.image_token_id is not None and self.image_token_id in token_ids:
            raise ParameterError(f"prompt: token id {self.image_token_id} is this multimodal checkpoint's image "
                                 f"placeholder; images are not supported (minivllm loads the text model only)",
                                 "prompt")
        for name in ("logit_bias", "allowed_token_ids", "stop_token_ids", "logprob_token_ids"):
            self._check_vocabulary(name, getattr(params, name))
        self._check_logprobs(params)
        if self.tokenizer is None:  # no checkpoint tokenizer, or skip_tokenizer_init
            for name, given in (("bad_words", params.bad_words), ("stop", params.stop_strings)):
                if given:
                    raise ParameterError(f"{name} needs a tokenizer, and this engine has none", name)
        if params.structured_outputs is not None:
            if self.structured is None:
                raise ValueError("structured_outputs needs a tokenizer, and this checkpoint has none")
            self.structured.validate(params.structured_outputs)

    def _check_vocabulary(self, name: str, ids) -> None:
        """Every token id of parameter ``name`` is in the vocabulary (all those outside named, in vLLM's words)."""
        bad = [t for t in ids or () if not 0 <= t < self.vocab_size]
        if bad:
            raise ParameterError(f"token_id(s) {bad} in {name} contain out-of-vocab token ids. Vocabulary size: "
                                 f"{self.vocab_size}", name)

    def _check_logprobs(self, params: SamplingParams) -> None:
        """At most the engine's ``max_logprobs`` alternatives per token (-1 asks for the whole vocabulary), in
        vLLM's words."""
        for name, kind in (("logprobs", "sample"), ("prompt_logprobs", "prompt")):
            k = getattr(params, name)
            if k:  # None and 0 ask for no alternatives
                k = self.vocab_size if k == -1 else k
                if k > self.max_logprobs:
                    raise ParameterError(f"Requested {kind} logprobs of {k}, which is greater than max allowed: "
                                         f"{self.max_logprobs}", name)
