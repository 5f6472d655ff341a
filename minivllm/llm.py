"""The public offline entry point (vLLM / nano-vLLM API): ``LLM(path).generate(prompts, SamplingParams(...))``."""

from __future__ import annotations

from typing import Any

from minivllm.beam_search import BeamSearchOutput, BeamSearchParams
from minivllm.engine.beam_search import run_beam_search
from minivllm.engine.tokenizer import chat_template_args, refuse_media_parts
from minivllm.lora.request import LoRARequest
from minivllm.sampling_params import SamplingParams


class LLM:
    """``LLM(path, **engine_kwargs).generate(prompts, SamplingParams(...))``.

    ``path`` is a local Hugging Face checkpoint folder. Use it as a context manager, or call ``close()``, to
    release its worker processes and memory early. ``engine`` is what runs the prompts: an ``LLMEngine`` (its
    ``add_request`` / ``step`` are the lower-level API), or with ``data_parallel_size=N`` (N > 1) a
    ``DataParallelEngine`` of N engine replicas on Ray. Either has ``run_batch(prompts, params, use_tqdm)``,
    ``tokenizer`` and ``close()``, which is all this class uses.
    """

    def __init__(self, model: str, **engine_kwargs):
        if (engine_kwargs.get("data_parallel_size") or 1) > 1:
            from minivllm.scale_out.data_parallel import DataParallelEngine

            self.engine: Any = DataParallelEngine(model, **engine_kwargs)
        else:
            from minivllm.engine.llm_engine import LLMEngine

            self.engine = LLMEngine(model, **engine_kwargs)

    def get_tokenizer(self):
        """The model's Hugging Face tokenizer (None for a checkpoint without one)."""
        return self.engine.tokenizer

    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = True, lora_request: LoRARequest | list[LoRARequest | None] | None = None
                 ) -> list[dict]:
        """Generate for a batch; returns ``[{"text", "token_ids", "finish_reason", ...}]`` in prompt order.

        ``prompts``: a string or a list of token ids, or a list of them; ``sampling_params``: one for all
        (None: the defaults) or one per prompt; ``lora_request``: the LoRA adapter of every prompt, or one per
        prompt (None: the base model; needs ``enable_lora=True``). ValueError naming the parameter for bad input,
        before any prompt runs.
        """
        prompts, params = batch_of_prompts(prompts, sampling_params)
        loras = batch_of_loras(lora_request, len(prompts))
        kw = {"lora_requests": loras} if loras is not None else {}
        return [out.to_dict() for out in self.engine.run_batch(prompts, params, use_tqdm=use_tqdm, **kw)]

    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Make a LoRA adapter known to the engine (its folder checked now); see ``LLMEngine.add_lora``."""
        return self._lora_engine("add_lora").add_lora(lora_request)

    def remove_lora(self, lora_int_id: int) -> bool:
        """Forget a LoRA adapter; False if unknown."""
        return self._lora_engine("remove_lora").remove_lora(lora_int_id)

    def list_loras(self) -> set[int]:
        """The ids of the adapters the engine knows."""
        return self._lora_engine("list_loras").list_loras()

    def _lora_engine(self, method: str):
        """The engine, if it has ``method`` (data-parallel replicas each keep their own adapters)."""
        if not hasattr(self.engine, method):
            raise ValueError(f"{method}: with data_parallel_size > 1 each replica checks an adapter when a request "
                             f"first names it; pass lora_request to generate")
        return self.engine

    def chat(self, messages: list[dict] | list[list[dict]], sampling_params: SamplingParams | list[SamplingParams]
             | None = None, use_tqdm: bool = True, chat_template: str | None = None, add_generation_prompt: bool = True,
             continue_final_message: bool = False, chat_template_kwargs: dict | None = None,
             tools: list[dict] | None = None, lora_request: LoRARequest | list[LoRARequest | None] | None = None
             ) -> list[dict]:
        """``generate`` on conversations (one, or a list of them) rendered by the chat template, as vLLM's
        ``LLM.chat``: the tokenizer's template, or ``chat_template``, with ``chat_template_kwargs`` (such as
        ``enable_thinking``). ``continue_final_message`` continues the last (assistant) message instead of
        starting a new one. ``tools``: OpenAI-style tool definitions (``{"type": "function", "function": {...}}``)
        that the template lists for the model, as vLLM's ``tools``; the output is text (parse any calls in it).
        ``lora_request``: as ``generate``'s, one for all conversations or one per conversation."""
        conversations = conversations_of(messages)
        for c in conversations:
            refuse_media_parts(c)
        if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
            raise ValueError(f"tools must be a list of tool definitions (dicts) or None, got {tools!r:.80}")
        tokenizer = self.engine.tokenizer
        if tokenizer is None:
            raise ValueError("chat needs a tokenizer, and this checkpoint has none")
        if not chat_template and not getattr(tokenizer, "chat_template", None):
            raise ValueError("chat_template is needed: this model's tokenizer has none")
        extra = {"tools": tools} if tools else {}
        prompts = [tokenizer.apply_chat_template(c, tokenize=False, **extra, **chat_template_args(
            add_generation_prompt, continue_final_message, chat_template, chat_template_kwargs,
            c[-1].get("role"))) for c in conversations]
        ids = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
        return self.generate(ids, sampling_params, use_tqdm=use_tqdm, lora_request=lora_request)

    def beam_search(self, prompts, params: BeamSearchParams, use_tqdm: bool = False,
                    concurrency_limit: int | None = None) -> list[BeamSearchOutput]:
        """Beam search, as vLLM's ``LLM.beam_search``; one ``BeamSearchOutput`` per prompt, in prompt order, whose
        ``sequences`` are the best ``params.beam_width`` (``tokens``: the prompt's and the generated ones, EOS
        included; ``text``: theirs, special tokens kept; ``cum_logprob``; ``logprobs``; ``finish_reason``).

        ``prompts``: a string or token ids, or a list of them (or of vLLM's ``{"prompt": ...}`` /
        ``{"prompt_token_ids": [...]}``). ``concurrency_limit``: search at most that many prompts at a time (None:
        all). ValueError naming the parameter for bad input, before any prompt runs.
        """
        if not isinstance(params, BeamSearchParams):
            raise ValueError(f"params must be a BeamSearchParams, got {type(params).__name__}")
        params.check_width(self.engine.config.model_config.max_logprobs)
        if concurrency_limit is not None and (not isinstance(concurrency_limit, int) or concurrency_limit < 1):
            raise ValueError(f"concurrency_limit must be an integer >= 1 or None, got {concurrency_limit!r}")
        if isinstance(prompts, dict):
            prompts = [prompts]
        if isinstance(prompts, (list, tuple)):
            prompts = [_beam_prompt(p) if isinstance(p, dict) else p for p in prompts]
        prompts, _ = batch_of_prompts(prompts, None)
        tokenizer = self.engine.tokenizer
        ids = []
        for p in prompts:
            if isinstance(p, str):
                if tokenizer is None:
                    raise ValueError("this checkpoint has no tokenizer: pass prompts as lists of token ids")
                p = tokenizer.encode(p)
            if not isinstance(p, (list, tuple)) or any(not isinstance(t, int) or isinstance(t, bool) for t in p):
                raise ValueError(f"a prompt must be a string or a list of token ids, got {type(p).__name__}")
            ids.append(list(p))
        return run_beam_search(self.engine, ids, params, use_tqdm, concurrency_limit)

    def close(self) -> None:
        """Release the engine: the model, the KV cache, worker processes, Ray replicas (idempotent)."""
        self.engine.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def batch_of_prompts(prompts, sampling_params) -> tuple[list, list[SamplingParams]]:
    """``generate``'s arguments as lists of equal length: one prompt (a string or token ids) or a list of them,
    and one ``SamplingParams`` (None: the defaults) or one per prompt (ValueError if the counts differ)."""
    if not isinstance(prompts, (str, list, tuple)):
        raise ValueError(f"prompts must be a string, a list of token ids, or a list of those, got "
                         f"{type(prompts).__name__}")
    if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
        prompts = [prompts]
    prompts = list(prompts)
    if sampling_params is None:
        sampling_params = SamplingParams()
    if isinstance(sampling_params, SamplingParams):
        sampling_params = [sampling_params] * len(prompts)
    if not isinstance(sampling_params, (list, tuple)):
        raise ValueError(f"sampling_params must be a SamplingParams or a list of them, got "
                         f"{type(sampling_params).__name__}")
    if len(sampling_params) != len(prompts):
        raise ValueError(f"got {len(sampling_params)} sampling params for {len(prompts)} prompts")
    return prompts, list(sampling_params)


def batch_of_loras(lora_request, num_prompts: int) -> list[LoRARequest | None] | None:
    """``generate``'s ``lora_request`` as one per prompt (None: no prompt has an adapter); ValueError naming it
    for a wrong type or count."""
    if lora_request is None:
        return None
    if isinstance(lora_request, LoRARequest):
        return [lora_request] * num_prompts
    if not isinstance(lora_request, (list, tuple)) or not all(
            r is None or isinstance(r, LoRARequest) for r in lora_request):
        raise ValueError(f"lora_request must be a LoRARequest, a list of them (None for the base model) or None, "
                         f"got {type(lora_request).__name__}")
    if len(lora_request) != num_prompts:
        raise ValueError(f"lora_request: got {len(lora_request)} for {num_prompts} prompts")
    return list(lora_request)


def _beam_prompt(prompt: dict) -> str | list[int]:
    """vLLM's prompt dicts (``{"prompt": text}`` or ``{"prompt_token_ids": ids}``) as a text or token ids."""
    if "prompt_token_ids" in prompt:
        return prompt["prompt_token_ids"]
    if "prompt" in prompt:
        return prompt["prompt"]
    raise ValueError(f"a prompt dict needs 'prompt' or 'prompt_token_ids', got keys {sorted(prompt)}")


def conversations_of(messages) -> list[list[dict]]:
    """``chat``'s ``messages`` as a list of conversations: one conversation (a non-empty list of message dicts) or
    a list of them (ValueError naming ``messages`` otherwise)."""
    if isinstance(messages, (list, tuple)) and messages and all(isinstance(m, dict) for m in messages):
        return [list(messages)]
    if isinstance(messages, (list, tuple)) and all(
            isinstance(c, (list, tuple)) and c and all(isinstance(m, dict) for m in c) for c in messages):
        return [list(c) for c in messages]  # no conversations at all: no outputs, as generate([])
    raise ValueError(f"messages must be a conversation (a non-empty list of message dicts, such as "
                     f"[{{'role': 'user', 'content': 'hi'}}]) or a list of them, got {type(messages).__name__}")
