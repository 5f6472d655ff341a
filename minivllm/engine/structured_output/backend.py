"""The grammar engine: llguidance, behind the few calls the engine makes.

Chosen over xgrammar by measurement: it fills a batch's masks and compiles a schema faster, and its slowest
single-row fills are shorter, which are the costs a step or a new request pays. Its one larger cost, a view of
the tokenizer built once per engine, is paid off the engine thread. The figures are in
docs/performance-notes.md ("xgrammar"); ``python benchmarks/structured/grammar_engines.py .bench/bigtok
--threads 2`` measures them again.
"""

from __future__ import annotations

import threading

from minivllm.structured_outputs_params import StructuredOutputsParams

#: the packed mask's word: 32 tokens per int32, token ``t`` at bit ``t % 32`` of word ``t // 32``
BITS = 32


def bitmask_words(vocab_size: int) -> int:
    """int32 words of one row's token bitmask."""
    return (vocab_size + BITS - 1) // BITS


class GuidanceBackend:
    """Grammars for requests' constraints, and matchers that follow a sequence's tokens through them.

    ``tokenizer`` is the engine's Hugging Face tokenizer; ``vocab_size`` the model's (ids past the tokenizer's
    are never allowed); ``eos_token_ids`` end a completed grammar. Thread-safe: compiling runs on worker threads.
    """

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: list[int]):
        self.hf_tokenizer, self.vocab_size, self.eos_token_ids = tokenizer, vocab_size, list(eos_token_ids)
        self._lock = threading.Lock()
        self._ll_tokenizer = None

    @property
    def ll_tokenizer(self):
        """llguidance's view of the tokenizer: every token's bytes (built once, on first use)."""
        with self._lock:
            if self._ll_tokenizer is None:
                import llguidance.hf

                # an EOS id the tokenizer lacks (a checkpoint's padded vocabulary) cannot end a grammar
                eos = [t for t in self.eos_token_ids if t < len(self.hf_tokenizer)]
                self._ll_tokenizer = llguidance.hf.from_tokenizer(
                    self.hf_tokenizer, n_vocab=self.vocab_size, eos_token=eos or None)
            return self._ll_tokenizer

    @staticmethod
    def grammar_text(so: StructuredOutputsParams) -> str:
        """The llguidance grammar of a constraint (not yet checked against the tokenizer); ValueError naming the
        field when it cannot even be written (a schema or grammar the converters reject)."""
        try:
            return GuidanceBackend._grammar_text(so)
        except ValueError:
            raise
        except Exception as exc:
            raise ValueError(f"structured_outputs.{so.kind} is invalid: {exc}") from None

    @staticmethod
    def _grammar_text(so: StructuredOutputsParams) -> str:
        import llguidance
        from llguidance.gbnf_to_lark import any_to_lark

        M = llguidance.LLMatcher
        kind = so.kind
        if kind in ("json", "json_object"):
            schema = so.json if kind == "json" else {"type": "object"}
            return M.grammar_from_json_schema(schema, defaults={"whitespace_flexible": not so.disable_any_whitespace})
        if kind == "regex":
            return M.grammar_from_regex(so.regex)
        if kind == "choice":
            # a JSON string literal is a Lark string literal: quotes and newlines stay escaped
            import json

            return M.grammar_from_lark("start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in so.choice))
        try:
            return M.grammar_from_lark(any_to_lark(so.grammar))
        except Exception as exc:  # the GBNF converter's own errors
            raise ValueError(f"structured_outputs.grammar is not a valid grammar: {exc}") from None

    def compile(self, so: StructuredOutputsParams):
        """A fresh matcher of ``so``'s grammar, the template that sequences copy; ValueError naming the field when
        the schema, the regex or the grammar is invalid."""
        import llguidance

        matcher = llguidance.LLMatcher(self.ll_tokenizer, self.grammar_text(so), log_level=0)
        if matcher.is_error():
            what = {"json": "JSON schema", "json_object": "JSON object", "regex": "regular expression",
                    "choice": "choice", "grammar": "grammar"}[so.kind]
            raise ValueError(f"structured_outputs.{so.kind} is not a valid {what}: {matcher.get_error().strip()}")
        return matcher


class Grammar:
    """One sequence's place in its grammar: ``accept`` each token it gets; ``is_stopped`` once nothing but the
    end of the output may follow."""

    __slots__ = ("matcher",)

    def __init__(self, matcher):
        self.matcher = matcher

    def accept(self, token_id: int) -> bool:
        """Advance by one token; False (and a stopped grammar) when the grammar does not allow it."""
        return self.matcher.consume_token(token_id)

    def allows(self, token_id: int) -> bool:
        """Whether the grammar takes ``token_id`` next (the state does not move)."""
        return self.matcher.validate_tokens([token_id]) == 1

    @property
    def is_stopped(self) -> bool:
        """Nothing but EOS may follow (the output is complete), or the grammar failed."""
        return self.matcher.is_stopped()
