"""One request's token stream and its bookkeeping. Pure Python: no torch."""

from __future__ import annotations

from enum import Enum, auto

from minivllm.core.thinking_budget import ThinkingBudget, ThinkingTracker
from minivllm.sampling_params import SamplingParams

#: token id of a sampled token whose value is still on the device (asynchronous scheduling)
PLACEHOLDER = -1


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


class Sequence:
    """Token ids of one completion of a request, and how many of them are computed.

    ``num_computed_tokens`` counts the leading tokens whose K/V are in the cache (or are being
    written by the step in flight). A step schedules ``num_tokens - num_computed_tokens`` new
    tokens at most; once every known token is computed, the row is sampled and a token appended.
    NOTE: the last appended token is never computed before the next step, so a running decode
    sequence always has exactly one uncomputed token.

    With asynchronous scheduling a step's sampled token is appended as a *placeholder*
    (``PLACEHOLDER``) when the step is launched, and its value written by ``resolve_token``
    once the step's results reach the host. ``num_pending_tokens`` counts the trailing
    placeholders (at most two: the step in flight and the one launched after it);
    ``pending_row`` is the newest one's row in its step's sampled-token tensor, which the
    next step reads on the device instead of the host value.

    With speculative decoding, ``spec_token_ids`` are the drafts proposed after its newest token, which the
    next step computes after it (``num_computed_tokens`` then runs ahead of the tokens until the step's output
    rolls back the rejected ones); ``num_new_tokens`` is how many tokens its latest output appended (accepted
    drafts and the one sampled after them).

    ``seq_id`` is given by the engine (unique among its live sequences). Its KV blocks are the block
    manager's (``BlockManager.block_table(seq_id)``).
    """

    def __init__(self, seq_id: int, token_ids: list[int], sampling_params: SamplingParams | None = None,
                 request_id: str | None = None, prompt_logprobs: int | None = None,
                 bad_words_token_ids: tuple[tuple[int, ...], ...] = (), watermark_history: int = 0,
                 thinking_budget: ThinkingBudget | None = None):
        if not token_ids:
            raise ValueError("a sequence needs at least one token")
        self.seq_id = seq_id
        self.request_id = request_id if request_id is not None else str(seq_id)
        self.status = SequenceStatus.WAITING
        self.token_ids: list[int] = list(token_ids)
        self.num_prompt_tokens = len(token_ids)
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prefix-cache hit tokens at the latest admission
        self.block_hashes: list[int] = []  # chained hashes of its full blocks (the block manager's memo)
        self.sampling_params = sampling_params or SamplingParams()
        self.num_preemptions = 0
        self.finish_reason: str | None = None  # "stop" | "length" | "abort"
        self.stop_reason: int | str | None = None
        self.num_pending_tokens = 0
        self.pending_row = -1
        # set on one sequence of a request that asks for prompt logprobs (the top-k count): its prompt is
        # computed, never read from the prefix cache, and each chunk's logprobs reported
        self.prompt_logprobs = prompt_logprobs
        # each bad word's token ids, derived from ``sampling_params.bad_words`` by the engine's tokenizer; one of
        # several tokens bans its last token after the others, so sampling reads the newest generated values
        self.bad_words_token_ids = bad_words_token_ids
        self.bad_word_context = max((len(w) - 1 for w in bad_words_token_ids), default=0)
        # the newest generated tokens sampling reads: a multi-token bad word's, the watermark's context and
        # the positions it deduplicates against (``watermark_history``: ``WatermarkConfig.history``)
        self.output_context = max(self.bad_word_context, watermark_history)
        self.thinking_budget = thinking_budget  # thinking_token_budget: it reads every token's value
        self.spec_token_ids: list[int] = []  # drafts to verify after its newest token (speculative decoding)
        self.num_new_tokens = 0  # tokens the latest step output appended
        self._thinking = ThinkingTracker(thinking_budget) if thinking_budget is not None else None

    def __len__(self) -> int:
        return len(self.token_ids)

    def __repr__(self) -> str:
        return (f"Sequence(id={self.seq_id}, status={self.status.name}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens}, pending={self.num_pending_tokens})")

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_completion_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def completion_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def last_token(self) -> int:
        return self.token_ids[-1]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_prefilling(self) -> bool:
        """More than the one newest token still needs computing (a prompt or a recompute)."""
        return len(self.token_ids) - self.num_computed_tokens > 1

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    @property
    def num_known_tokens(self) -> int:
        """Tokens whose values the host knows (all but the pending placeholders)."""
        return len(self.token_ids) - self.num_pending_tokens

    @property
    def num_known_completion_tokens(self) -> int:
        return len(self.token_ids) - self.num_pending_tokens - self.num_prompt_tokens

    @property
    def reads_output_values(self) -> bool:
        """Sampling reads the values of its newest generated tokens on the host (bad words of several tokens, the
        watermark)."""
        return self.output_context > 0 or self.thinking_budget is not None

    @property
    def can_speculate(self) -> bool:
        """Drafts may be verified after its tokens: its sampling at a position reads no token values on the host,
        and a grammar it follows starts at its first token (one that waits for a reasoning's end marker decides
        on the host when it applies)."""
        so = self.sampling_params.structured_outputs
        return not self.reads_output_values and (so is None or not so.starts_after)

    def forced_token(self) -> int | None:
        """The token the next step must sample (``thinking_token_budget`` forcing the reasoning's end), or None."""
        return self._thinking.forced_token(self.token_ids) if self._thinking is not None else None

    def output_tail(self) -> tuple[int, ...]:
        """The newest generated tokens sampling reads (``output_context`` of them; all known: see
        ``reads_output_values``)."""
        start = max(self.num_prompt_tokens, len(self.token_ids) - self.output_context)
        return tuple(self.token_ids[start:])

    def prompt_logprob_targets(self, start: int, n: int) -> tuple[int, tuple[int, ...]] | None:
        """``(k, targets)`` of a chunk of ``n`` tokens from ``start``: position ``p`` of it gives the logprob of
        prompt token ``p + 1`` (``targets``: those tokens); None when no position does."""
        end = min(start + n, self.num_prompt_tokens - 1)
        return (self.prompt_logprobs, tuple(self.token_ids[start + 1:end + 1])) if end > start else None

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def append_placeholder(self, row: int) -> None:
        """Append the token that row ``row`` of the step just launched will sample."""
        self.token_ids.append(PLACEHOLDER)
        self.num_pending_tokens += 1
        self.pending_row = row

    def resolve_token(self, token_id: int) -> None:
        """Write the value of the oldest pending placeholder."""
        if not self.num_pending_tokens:
            raise RuntimeError(f"no pending token to resolve in {self}")
        self.token_ids[len(self.token_ids) - self.num_pending_tokens] = token_id
        self.num_pending_tokens -= 1

    def drop_pending(self) -> None:
        """Forget the placeholders (the sequence finished before their steps reported)."""
        if self.num_pending_tokens:
            del self.token_ids[len(self.token_ids) - self.num_pending_tokens:]
            self.num_pending_tokens = 0
