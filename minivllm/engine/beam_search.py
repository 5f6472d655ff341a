"""Beam search on an engine's public API, as vLLM V1 runs it: above the engine, one request of one token per live
beam and step (``minivllm/beam_search.py`` has the search itself).

Each step's requests are the beams' whole token lists as prompts: the prefix cache holds the blocks the beams
share, so a step computes little more than each beam's last, partial block. ``run_beam_search`` drives an offline
engine (``LLMEngine``, or the data-parallel one: anything with ``run_batch``) for ``LLM.beam_search``.
"""

from __future__ import annotations

from minivllm.beam_search import BeamSearch, BeamSearchOutput, BeamSearchParams
from minivllm.outputs import RequestOutput


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
