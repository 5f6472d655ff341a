"""Beam search on an engine's public API, as vLLM V1 runs it: above the engine, one request of one token per live
beam and step (``minivllm/beam_search.py`` has the search itself).

Each step's requests are the beams' whole token lists as prompts: the prefix cache holds the blocks the beams
share, so a step computes little more than each beam's last, partial block. ``run_beam_search`` drives an offline
engine (``LLMEngine``, or the data-parallel one: anything with ``run_batch``) for ``LLM.beam_search``;
``BeamSearchStream`` drives an ``EngineClient`` for the server, as the one output stream of a request.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import replace

from minivllm.beam_search import BeamSearch, BeamSearchOutput, BeamSearchParams, BeamSearchSequence
from minivllm.engine.protocol import EngineClient, OutputStream
from minivllm.lora.request import LoRARequest
from minivllm.outputs import CompletionOutput, RequestOutput


def engine_eos_token_ids(config, tokenizer) -> list[int]:
    """The tokens that end a sequence, as ``LLMEngine`` reads them: the checkpoint's EOS ids, else the tokenizer's."""
    eos = list(config.model_config.arch.eos_token_ids)
    if not eos and tokenizer is not None and tokenizer.eos_token_id is not None:
        eos = [tokenizer.eos_token_id]
    return eos


def run_beam_search(engine, prompts: list[list[int]], params: BeamSearchParams, use_tqdm: bool = False,
                    concurrency_limit: int | None = None) -> list[BeamSearchOutput]:
    """Beam search of every prompt (token ids) on an offline engine, the steps of ``concurrency_limit`` prompts at a
    time (None: all) batched together; one ``BeamSearchOutput`` per prompt, with the sequences' text (prompt
    included, special tokens kept, as vLLM). ValueError for a bad prompt, before any step runs."""
    tokenizer, mc = engine.tokenizer, engine.config.model_config
    for p in prompts:
        _check_prompt(p, mc.max_model_len, mc.arch.vocab_size)
    eos = engine_eos_token_ids(engine.config, tokenizer)
    searches = [BeamSearch(p, params, eos, mc.max_model_len) for p in prompts]
    step_params = params.step_params()
    limit = concurrency_limit or max(1, len(searches))
    pbar = None
    if use_tqdm:
        from tqdm.auto import tqdm

        pbar = tqdm(total=len(searches), desc="Beam search", unit="prompt", dynamic_ncols=True)
    try:
        # the first unfinished searches, at most `limit`: one that finishes makes room for the next
        while running := [s for s in searches if not s.done][:limit]:
            beams = [beam.tokens for s in running for beam in s.live]
            outputs = iter(engine.run_batch(beams, [step_params] * len(beams), use_tqdm=False))
            for s in running:
                s.advance([_candidates(next(outputs)) for _ in s.live])
                if pbar is not None and s.done:
                    pbar.update(1)
    finally:
        if pbar is not None:
            pbar.close()
    results = []
    for s in searches:
        best = s.best()
        for seq in best:
            seq.text = _decode_all(tokenizer, seq.tokens)
        results.append(BeamSearchOutput(best))
    return results


def _decode_all(tokenizer, token_ids: list[int]) -> str:
    """The text of ``token_ids``, special tokens kept (ids past the tokenizer's vocabulary give none)."""
    if tokenizer is None:
        return ""
    n = len(tokenizer)
    return tokenizer.decode([t for t in token_ids if t < n], skip_special_tokens=False)


def _check_prompt(token_ids: list[int], max_model_len: int, vocab_size: int) -> None:
    """The engine's checks of a prompt, made before a search starts (ValueError naming the prompt)."""
    if not token_ids:
        raise ValueError("the prompt is empty: it must have at least one token")
    if len(token_ids) >= max_model_len:
        raise ValueError(f"the prompt has {len(token_ids)} tokens, but max_model_len is {max_model_len}: "
                         f"it must be shorter to leave room for at least one generated token")
    bad = next((t for t in token_ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise ValueError(f"prompt token id {bad} is outside the vocabulary [0, {vocab_size})")


def _candidates(out: RequestOutput) -> dict[int, float] | None:
    """A step's candidates of one beam: the logprobs of its one token (None if it got none)."""
    logprobs = out.outputs[0].logprobs
    return logprobs[0] if logprobs else None


class BeamSearchStream:
    """The beam search of one prompt on an ``EngineClient``, as an ``OutputStream``: iterating it runs the search
    and yields one final ``RequestOutput`` whose completions are the ``num_outputs`` best sequences, best first.

    Each completion holds the generated tokens only (an EOS that ended it only with ``include_stop_str_in_output``),
    their text (``decode``), the candidates' logprobs of each step, and its whole text also as the delta, so that a
    streamed response sends it at once. ``prompt_logprobs``: the prompt's, from the first step's request. ``abort``
    ends the search: its requests in flight are aborted and it yields what it has with finish reason ``abort``.
    ``lora_request``: the adapter every step's requests run with (None: the base model).
    """

    def __init__(self, client: EngineClient, prompt_token_ids: list[int], params: BeamSearchParams, request_id: str,
                 *, num_outputs: int, eos_token_ids: Collection[int], max_model_len: int,
                 decode: Callable[[list[int]], str], seed: int | None = None, prompt_logprobs: int | None = None,
                 lora_request: LoRARequest | None = None):
        self.request_id, self.finished = request_id, False
        self._client, self._params, self._decode = client, params, decode
        self._prompt = list(prompt_token_ids)
        self._num_outputs = num_outputs
        self._search = BeamSearch(prompt_token_ids, params, eos_token_ids, max_model_len)
        self._step_params = params.step_params(seed)
        self._prompt_logprobs = prompt_logprobs
        self._lora_request = lora_request
        self._first: RequestOutput | None = None  # the first step's output (prompt logprobs, cached tokens)
        self._in_flight: list[OutputStream] = []
        self._aborted = False

    def __aiter__(self) -> AsyncIterator[RequestOutput]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[RequestOutput]:
        try:
            out = await self._run()
            self.finished = True
            yield out
        finally:
            self.abort()

    def abort(self) -> None:
        """End the search unless it finished, aborting its requests in flight (idempotent)."""
        if not self.finished:
            self.finished = self._aborted = True
            for s in self._in_flight:
                s.abort()

    async def _run(self) -> RequestOutput:
        search = self._search
        try:
            while not search.done and not self._aborted:
                self._in_flight = await self._start_step()
                finals = [await _last(s) for s in self._in_flight]
                if self._first is None:
                    self._first = finals[0]
                if self._aborted or any(f is None or f.outputs[0].finish_reason == "abort" for f in finals):
                    self._aborted = True
                    break
                search.advance([_candidates(f) for f in finals])
        finally:
            for s in self._in_flight:
                s.abort()
            self._in_flight = []
        return self._output()

    async def _start_step(self) -> list[OutputStream]:
        """One request per live beam (the first step's with the prompt's logprobs); all aborted if one fails."""
        search, step = self._search, self._search.steps
        params = self._step_params
        if step == 0 and self._prompt_logprobs is not None:
            params = replace(params, prompt_logprobs=self._prompt_logprobs)
        # added together, so that the engine loop takes them in one step
        adds = [asyncio.ensure_future(self._client.add_request(beam.tokens, params, f"{self.request_id}-s{step}-b{i}",
                                                               lora_request=self._lora_request))
                for i, beam in enumerate(search.live)]
        try:
            await asyncio.wait(adds)
        except asyncio.CancelledError:
            _undo(adds)
            raise
        failed = next((a.exception() for a in adds if a.exception() is not None), None)
        if failed is not None:
            _undo(adds)
            raise failed
        return [a.result() for a in adds]

    def _output(self) -> RequestOutput:
        """The final output: the best sequences as completions (finish reason ``abort`` if the search was)."""
        search = self._search
        best = search.best()[:self._num_outputs]
        outs = [self._completion(i, seq) for i, seq in enumerate(best)]
        first = self._first
        return RequestOutput(self.request_id, None, list(self._prompt), outs, finished=True,
                             num_cached_tokens=first.num_cached_tokens if first is not None else 0,
                             prompt_logprobs=first.prompt_logprobs if first is not None else None)

    def _completion(self, index: int, seq: BeamSearchSequence) -> CompletionOutput:
        search = self._search
        ids = seq.tokens[search.prompt_len:]
        if seq.finish_reason == "stop" and not self._params.include_stop_str_in_output:
            ids = ids[:-1]
        reason = "abort" if self._aborted else seq.finish_reason
        text = self._decode(ids)
        return CompletionOutput(index, text, ids, reason, None, list(seq.logprobs), delta_text=text,
                                delta_token_ids=list(ids), delta_logprobs=list(seq.logprobs))


def _undo(adds: list[asyncio.Future]) -> None:
    """Abort the requests that were added, and cancel the adds still under way (the client aborts what it added)."""
    for a in adds:
        if not a.done():
            a.cancel()
        elif not a.cancelled() and a.exception() is None:
            a.result().abort()


async def _last(stream: OutputStream) -> RequestOutput | None:
    """A stream's final output (None if it ended without one)."""
    last = None
    async for out in stream:
        last = out
    return last
