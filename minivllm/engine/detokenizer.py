"""Incremental detokenization with stop strings (vLLM's prefix_offset / read_offset scheme).

Each step converts only the NEW ids to token strings and decodes a small trailing window of
tokens twice (``tokens[prefix_offset:read_offset]`` and ``tokens[prefix_offset:]``); the new text is
the difference. Text that ends in an incomplete character (``"\\ufffd"``, a multi-byte UTF-8
character split over byte-level BPE tokens) is held back until the character completes, so the
accumulated text equals ``tokenizer.decode(output_ids)`` for byte-level BPE tokenizers (decoded
without ``clean_up_tokenization_spaces``, as vLLM does).

Stop strings are searched only in the newly added text plus the ``max(len(stop)) - 1`` characters
before it; the earliest match wins. The output is cut before it (or after it with
``include_stop_str_in_output``), and nothing is emitted afterwards. While a suffix of the text is
a prefix of some stop string it is held back from the streamed deltas, so a delta never contains
text that a later stop would cut. When the request finishes for another reason (EOS, max_tokens,
abort), call :meth:`IncrementalDetokenizer.finish` (or pass ``finished=True`` to the last
:meth:`~IncrementalDetokenizer.step`) to flush what was held back.
"""

from __future__ import annotations

from collections.abc import Sequence

#: prompt tokens kept as left context for the first output tokens (vLLM uses 5).
PROMPT_CONTEXT_TOKENS = 5
_REPLACEMENT_CHAR = "\ufffd"
_MAX_TOKEN_ID = (1 << 31) - 1


def special_token_ids(tokenizer) -> frozenset[int]:
    """Ids that ``decode(..., skip_special_tokens=True)`` drops: the tokenizer's special ids plus
    every added token flagged ``special`` (``all_special_ids`` alone can miss some of those)."""
    ids = set(getattr(tokenizer, "all_special_ids", ()) or ())
    for i, tok in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(tok, "special", False):
            ids.add(int(i))
    return frozenset(ids)


class IncrementalDetokenizer:
    """Turns the token ids of one request into streamed text deltas.

    Attributes: ``output_text`` (all text decoded so far, after the stop cut; it may run ahead
    of the streamed deltas by a held-back partial stop string), ``stop_reason`` (the stop string
    that matched, else None), ``finished_by_stop``.
    """

    def __init__(
        self,
        tokenizer,
        prompt_token_ids: Sequence[int] = (),
        skip_special_tokens: bool = True,
        stop: Sequence[str] | str | None = None,
        include_stop_str_in_output: bool = False,
        min_tokens: int = 0,
        special_ids: frozenset[int] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        if isinstance(stop, str):
            stop = [stop]
        self.stop: list[str] = [s for s in (stop or []) if s]
        self.include_stop_str_in_output = include_stop_str_in_output
        self.min_tokens = min_tokens
        self._max_stop_len = max((len(s) for s in self.stop), default=0)
        # ``special_ids`` (the engine computes them once per tokenizer) saves a pass over the vocabulary
        if not skip_special_tokens:
            self._skip_ids = frozenset()
        else:
            self._skip_ids = special_ids if special_ids is not None else special_token_ids(tokenizer)

        self.output_text = ""
        self.stop_reason: str | None = None
        self.finished_by_stop = False
        self.num_output_ids = 0  # ids received by step(), decodable or not

        # left context from the prompt, so the first output token decodes as it would in context
        # (e.g. the leading space of a SentencePiece "▁word"); never part of output_text.
        context = self._to_tokens(list(prompt_token_ids)[-(PROMPT_CONTEXT_TOKENS + 2) :])
        self._tokens: list[str] = context[-PROMPT_CONTEXT_TOKENS:]
        self._prefix_offset = 0
        self._read_offset = len(self._tokens)
        self._emitted = 0  # len(output_text) already returned as deltas

    # ------------------------------------------------------------------------------------------

    def _to_tokens(self, ids: Sequence[int]) -> list[str]:
        """Token strings of ``ids``; ids unknown to the tokenizer (and skipped specials) vanish."""
        skip = self._skip_ids
        ids = [i for i in map(int, ids) if 0 <= i <= _MAX_TOKEN_ID and i not in skip]
        if not ids:
            return []
        tokens = self.tokenizer.convert_ids_to_tokens(ids)
        if isinstance(tokens, str):
            tokens = [tokens]
        return [t for t in tokens if t is not None]

    def _decode_tokens(self, tokens: list[str]) -> str:
        return self.tokenizer.convert_tokens_to_string(tokens) if tokens else ""

    def _find_stop(self, new_chars: int) -> tuple[str, int] | None:
        text = self.output_text
        start = max(0, len(text) - new_chars - self._max_stop_len + 1)
        best: tuple[str, int] | None = None
        for s in self.stop:
            i = text.find(s, start)
            if i != -1 and (best is None or i < best[1]):
                best = (s, i)
        return best

    def _partial_stop_len(self) -> int:
        """Length of the longest suffix of output_text that is a proper prefix of a stop string."""
        text = self.output_text
        best = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best

    # ------------------------------------------------------------------------------------------

    def step(self, new_token_ids: Sequence[int], finished: bool = False) -> str:
        """Add the request's newly generated ids; return the new text to stream (maybe "").

        ``finished=True`` marks the request's last step: text held back (an incomplete character,
        a possible stop-string prefix) is flushed.
        """
        if self.finished_by_stop:
            return ""
        self.num_output_ids += len(new_token_ids)
        new_tokens = self._to_tokens(new_token_ids)
        self._tokens.extend(new_tokens)

        new_chars = 0
        if self._read_offset < len(self._tokens):
            prefix_text = self._decode_tokens(self._tokens[self._prefix_offset : self._read_offset])
            new_text = self._decode_tokens(self._tokens[self._prefix_offset :])
            if len(new_text) > len(prefix_text) and (finished or not new_text.endswith(_REPLACEMENT_CHAR)):
                added = new_text[len(prefix_text) :]
                self.output_text += added
                new_chars = len(added)
                self._prefix_offset = self._read_offset
                self._read_offset = len(self._tokens)
                if self._prefix_offset > 64:  # keep the token list short
                    del self._tokens[: self._prefix_offset]
                    self._read_offset -= self._prefix_offset
                    self._prefix_offset = 0

        if new_chars and self.stop and self.num_output_ids > self.min_tokens:
            match = self._find_stop(new_chars)
            if match is not None:
                stop_str, index = match
                cut = index + len(stop_str) if self.include_stop_str_in_output else index
                self.output_text = self.output_text[:cut]
                self.stop_reason = stop_str
                self.finished_by_stop = True

        end = len(self.output_text)
        if not (finished or self.finished_by_stop):
            end -= self._partial_stop_len()
        if end <= self._emitted:
            return ""
        delta = self.output_text[self._emitted : end]
        self._emitted = end
        return delta

    def finish(self) -> str:
        """Flush the held-back text at the end of the request (same as ``step([], finished=True)``)."""
        return self.step([], finished=True)

    @property
    def streamed_text(self) -> str:
        """The text returned by the deltas so far."""
        return self.output_text[: self._emitted]
