"""Beam search, as vLLM has it (``vllm/beam_search.py``): its parameters, its sequences and outputs, the score with
the length penalty, and ``BeamSearch``, the search of one prompt step by step.

The search runs above the engine, as in vLLM V1: each step asks the engine for one token of every live beam, with
the ``2 * beam_width`` most likely next tokens and their logprobs (``BeamSearch.step_params``); every beam and
candidate token make a new sequence, the ones that end with EOS are complete, and the ``beam_width`` others with the
highest cumulative logprob live on. After ``max_tokens`` steps the complete and the live sequences are ranked by
``get_beam_search_score`` and the best ``beam_width`` are the result. The drivers (offline and online) are in
``engine/beam_search.py``; this module is pure Python.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field

from minivllm.config.fields import check_types
from minivllm.sampling_params import SamplingParams

__all__ = ["BeamSearch", "BeamSearchOutput", "BeamSearchParams", "BeamSearchSequence", "get_beam_search_score"]


@dataclass
class BeamSearchParams:
    """How to search (vLLM's ``BeamSearchParams``).

    - ``beam_width``: how many sequences live on after each step, and how many the search returns.
    - ``max_tokens``: how many tokens a sequence may get (the number of steps).
    - ``ignore_eos``: EOS ends no sequence (it is a token like any other).
    - ``temperature``: the temperature of each step's one-token request. Candidates are the most likely tokens by
      their raw logprobs whatever it is; the token that request samples is a candidate too (as in vLLM), so a
      temperature above 0 can add one more, drawn at random.
    - ``length_penalty``: the exponent of the length in the score (``get_beam_search_score``); above 0 it favours
      longer sequences, below 0 shorter ones, 0 ranks by cumulative logprob alone.
    - ``include_stop_str_in_output``: the server's completions keep the EOS token that ended a sequence.
    """

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        check_types(self)  # a wrong type gets a ValueError naming the parameter
        if self.beam_width < 1:
            raise ValueError(f"beam_width must be an integer >= 1, got {self.beam_width}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not math.isfinite(self.length_penalty):
            raise ValueError(f"length_penalty must be a finite number, got {self.length_penalty}")

    def check_width(self, max_logprobs: int) -> None:
        """ValueError naming ``beam_width`` when each step would ask an engine of ``max_logprobs`` (-1: the whole
        vocabulary) for more logprobs than it returns."""
        if max_logprobs != -1 and 2 * self.beam_width > max_logprobs:
            raise ValueError(f"beam_width {self.beam_width} is too large: each step asks the engine for the "
                             f"2 * beam_width = {2 * self.beam_width} most likely tokens, and it returns at most "
                             f"max_logprobs = {max_logprobs} (raise it with --max-logprobs)")

    def step_params(self, seed: int | None = None) -> SamplingParams:
        """The parameters of one step's request for one beam: one token, with the ``2 * beam_width`` most likely
        next tokens' logprobs."""
        return SamplingParams(max_tokens=1, logprobs=2 * self.beam_width, temperature=self.temperature, seed=seed)


@dataclass
class BeamSearchSequence:
    """One sequence of a beam search: ``tokens`` (the prompt's, then the generated ones, the EOS that ended it
    included), per generated token the candidates' logprobs of its step (``{token_id: logprob}``, raw logprobs as
    ``SamplingParams.logprobs`` gives them), their cumulative logprob, and once returned its text and why it ended
    (``finish_reason``: ``stop`` for EOS, ``length`` for ``max_tokens`` or the model's context)."""

    tokens: list[int]
    logprobs: list[dict[int, float]] = field(default_factory=list)
    cum_logprob: float = 0.0
    text: str | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class BeamSearchOutput:
    """A prompt's result: its best sequences, best first (``beam_width`` of them, fewer only when fewer exist)."""

    sequences: list[BeamSearchSequence]


def get_beam_search_score(tokens: list[int], cumulative_logprob: float, eos_token_id: int | Collection[int] | None,
                          length_penalty: float = 1.0) -> float:
    """A sequence's score, vLLM's (after transformers'): ``cumulative_logprob / length ** length_penalty``, where
    ``length`` counts all of ``tokens``, the prompt's included, but not an EOS token that ends them."""
    eos = {eos_token_id} if isinstance(eos_token_id, int) else set(eos_token_id or ())
    seq_len = len(tokens) - (1 if tokens and tokens[-1] in eos else 0)
    return cumulative_logprob / (seq_len ** length_penalty)


class BeamSearch:
    """The beam search of one prompt, one step at a time.

    ``live`` are the sequences to extend this step (ask the engine for ``params.step_params()`` on each one's
    ``tokens``); ``advance`` takes, per live sequence, the logprobs of its next token's candidates. ``done`` once
    ``max_tokens`` steps ran (or no sequence can grow); ``best()`` is the result. ``eos_token_ids``: the tokens that
    end a sequence (unless ``ignore_eos``); ``max_model_len``: a sequence that long cannot grow and ends with
    ``length``.
    """

    def __init__(self, prompt_token_ids: list[int], params: BeamSearchParams, eos_token_ids: Collection[int],
                 max_model_len: int | None = None):
        self.params = params
        self.eos = frozenset(() if params.ignore_eos else eos_token_ids)
        self.all_eos = frozenset(eos_token_ids)  # the score never counts an EOS that ends a sequence
        self.max_model_len = max_model_len
        self.prompt_len = len(prompt_token_ids)
        self.live: list[BeamSearchSequence] = [BeamSearchSequence(list(prompt_token_ids))]
        self.completed: list[BeamSearchSequence] = []
        self.steps = 0

    @property
    def done(self) -> bool:
        return not self.live or self.steps >= self.params.max_tokens

    def advance(self, candidates: list[dict[int, float] | None]) -> None:
        """One step: ``candidates[i]`` is ``{token_id: logprob}`` of the next token of ``live[i]`` (None: the
        engine could not extend it, and it is dropped, as vLLM drops an aborted beam)."""
        if len(candidates) != len(self.live):
            raise ValueError(f"got candidates for {len(candidates)} sequences, {len(self.live)} are live")
        grown = []
        for beam, lps in zip(self.live, candidates):
            for token_id, logprob in (lps or {}).items():
                seq = BeamSearchSequence(beam.tokens + [token_id], beam.logprobs + [lps], beam.cum_logprob + logprob)
                if token_id in self.eos:
                    seq.finish_reason = "stop"
                    self.completed.append(seq)
                else:
                    grown.append(seq)
        # sequences of one step have one length: the best by cumulative logprob are the best by score (the sort
        # is stable: ties keep the order of their beams, then of the engine's candidates)
        grown.sort(key=lambda s: s.cum_logprob, reverse=True)
        self.live = grown[:self.params.beam_width]
        self.steps += 1
        if self.max_model_len is not None:
            full = [s for s in self.live if len(s.tokens) >= self.max_model_len]
            for s in full:
                s.finish_reason = "length"
            self.completed += full
            self.live = [s for s in self.live if len(s.tokens) < self.max_model_len]

    def score(self, seq: BeamSearchSequence) -> float:
        """``get_beam_search_score`` of a sequence with this search's length penalty."""
        return get_beam_search_score(seq.tokens, seq.cum_logprob, self.all_eos, self.params.length_penalty)

    def best(self) -> list[BeamSearchSequence]:
        """The best ``beam_width`` of the complete and live sequences by score, best first (a sequence still live
        ends with ``length``)."""
        for s in self.live:
            s.finish_reason = s.finish_reason or "length"
        ranked = sorted(self.completed + self.live, key=self.score, reverse=True)
        return ranked[:self.params.beam_width]
