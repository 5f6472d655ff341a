"""A request's inputs, checked and turned into token ids off the event loop.

``RequestLimits`` caps what one request may ask for (``n``, ``best_of``, stop strings: a 400 naming the field
beyond them); how many logprobs is the engine's ``max_logprobs``, which the engine checks. Tokenization and chat
templating run in a worker thread; a text that cannot fit in ``max_model_len`` tokens whatever the tokenizer does
(more characters than the longest token times ``max_model_len``) is refused before any of it is tokenized.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from minivllm.entrypoints.openai import protocol as P
from minivllm.entrypoints.openai.errors import APIError


@dataclass(frozen=True)
class RequestLimits:
    """The per-request caps of ``ServerConfig``."""

    max_n: int = 128
    max_stop_strings: int = 16
    max_stop_string_chars: int = 256
    trust_request_chat_template: bool = False

    def check_template(self, chat_template: str | None) -> None:
        """A 400 for a request's own chat template unless the server trusts them (a template is code it runs:
        a loop in one could hold a worker thread for hours)."""
        if chat_template is not None and not self.trust_request_chat_template:
            raise APIError(400, "chat_template in a request is refused: start the server with "
                                "--trust-request-chat-template to allow it", param="chat_template")

    def check(self, req: P.SamplingRequest, logprobs: int | None, logprobs_field: str) -> None:
        """A 400 naming the field for a request over a cap."""
        if not 1 <= req.n <= self.max_n:
            raise APIError(400, f"n must be an integer in [1, {self.max_n}], got {req.n}", param="n")
        if req.best_of is not None:
            if not req.n <= req.best_of <= self.max_n:
                raise APIError(400, f"best_of must be an integer in [n, {self.max_n}], got {req.best_of}",
                               param="best_of")
            if req.best_of != req.n and not req.use_beam_search:
                raise APIError(400, "best_of other than n is supported only with use_beam_search", param="best_of")
        if logprobs is not None and logprobs < -1:  # -1: the whole vocabulary (the engine checks the maximum)
            raise APIError(400, f"{logprobs_field} must be non-negative or -1, got {logprobs}", param=logprobs_field)
        stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        if len(stop) > self.max_stop_strings:
            raise APIError(400, f"at most {self.max_stop_strings} stop strings are allowed, got {len(stop)}",
                           param="stop")
        if any(len(s) > self.max_stop_string_chars for s in stop):
            raise APIError(400, f"a stop string may have at most {self.max_stop_string_chars} characters",
                           param="stop")


class Tokenization:
    """The server's tokenizer work, in a worker thread; ``max_token_chars`` bounds how many characters one
    token can stand for, so a text longer than ``max_model_len`` such tokens is refused untokenized."""

    def __init__(self, tokenizer, max_model_len: int):
        self.tokenizer, self.max_model_len = tokenizer, max_model_len
        # byte-level BPE and SentencePiece tokens decode to at most as many characters as their vocabulary
        # entry has; added tokens are their text
        self.max_token_chars = max((len(t) for t in tokenizer.get_vocab()), default=1) if tokenizer else 1

    def _require(self) -> None:
        if self.tokenizer is None:
            raise APIError(400, "this model has no tokenizer: send prompts as lists of token ids", param="prompt")

    def _check_length(self, chars: int, field: str) -> None:
        if chars > self.max_model_len * self.max_token_chars:
            raise APIError(400, f"{field} has {chars} characters, more than max_model_len ({self.max_model_len}) "
                                f"tokens can hold", param=field)

    async def encode(self, text: str, field: str = "prompt", add_special_tokens: bool = True,
                     check_length: bool = True) -> list[int]:
        """``text`` as token ids; ``check_length=False`` (the prompt is truncated after) tokenizes any length the
        body cap lets through."""
        self._require()
        if check_length:
            self._check_length(len(text), field)
        return await asyncio.to_thread(self.tokenizer.encode, text, add_special_tokens=add_special_tokens)

    async def chat(self, messages: list[P.ChatMessage], template_args: dict | None = None,
                   add_special_tokens: bool = False) -> list[int]:
        """The messages rendered with the chat template (the tokenizer's, or ``template_args["chat_template"]``),
        tokenized. ``template_args``: ``apply_chat_template``'s keyword arguments (``protocol.template_args``);
        ``add_special_tokens``: the tokenizer's own too (a BOS the template already wrote would come twice)."""
        self._require()
        args = dict(template_args or {"add_generation_prompt": True})
        if not args.get("chat_template") and not getattr(self.tokenizer, "chat_template", None):
            raise APIError(400, "this model's tokenizer has no chat template: use /v1/completions, or send one "
                                "in chat_template", param="messages")
        msgs = [m.to_template() for m in messages]
        self._check_length(sum(len(str(m.get("content", ""))) for m in msgs), "messages")
        return await asyncio.to_thread(self._render, msgs, args, add_special_tokens)

    def _render(self, msgs: list[dict], args: dict, add_special_tokens: bool) -> list[int]:
        try:
            text = self.tokenizer.apply_chat_template(msgs, tokenize=False, **args)
        except Exception as exc:  # a template raises what its author chose: the client's input is at fault
            param = "chat_template" if args.get("chat_template") else "messages"
            raise APIError(400, f"the chat template failed on these messages: {exc}", param=param) from exc
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    async def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        """Token ids to text (ids outside the tokenizer's vocabulary are dropped)."""
        if len(token_ids) < 256:  # short ones cost less than a thread
            return self.decode_now(token_ids, skip_special_tokens)
        return await asyncio.to_thread(self.decode_now, token_ids, skip_special_tokens)

    def decode_now_with_special(self, token_ids: list[int]) -> str:
        """:meth:`decode_now` keeping the special tokens (a reasoning parser's tags may be special)."""
        return self.decode_now(token_ids, skip_special_tokens=False)

    def decode_now(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        """:meth:`decode` on this thread (for a few tokens)."""
        if self.tokenizer is None:
            return ""
        n = len(self.tokenizer)
        return self.tokenizer.decode([t for t in token_ids if 0 <= t < n], skip_special_tokens=skip_special_tokens)
