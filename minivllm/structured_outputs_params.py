"""What a request's output must match (vLLM's ``StructuredOutputsParams``): a JSON schema, any JSON object, a
regular expression, one of a list of strings, or a grammar. Validated for shape on construction; the grammar
engine checks the schema, the regex or the grammar itself when the request is added."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field

#: the constraint kinds, in the order they are looked for
KINDS = ("json", "json_object", "regex", "choice", "grammar")


@dataclass
class StructuredOutputsParams:
    """Exactly one constraint of a request's output.

    - ``json``: a JSON schema (a dict, or its JSON text); the output is a JSON value it validates.
    - ``json_object``: ``True``: the output is some JSON object.
    - ``regex``: the whole output matches this regular expression.
    - ``choice``: the output is exactly one of these strings.
    - ``grammar``: a Lark grammar (llguidance's dialect, with ``start``) or a GBNF one (``root ::= ...``).
    - ``disable_any_whitespace``: JSON without whitespace between its tokens (``{"a":1,"b":[2]}``). On by
      default, unlike vLLM: with any whitespace allowed between tokens, a model that is unsure of JSON fills
      its output with blanks until ``max_tokens`` cuts it (seen with the demo model on 6 of 20 schemas).
    """

    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = True
    #: the grammar starts after the output ends with these token ids (empty: at the first token). The OpenAI
    #: server sets it to the reasoning's end marker when the prompt leaves a thinking model reasoning (vLLM holds
    #: a grammar back while a reasoning parser says the model reasons); not a constructor argument, as in vLLM.
    starts_after: tuple[int, ...] = field(default=(), init=False, compare=False)
    #: with ``starts_after``: the grammar applies from the first token, unless that token is this one (the
    #: reasoning's start marker) and the grammar does not allow it; it then starts after ``starts_after``
    opened_by: int | None = field(default=None, init=False, compare=False)

    def __post_init__(self) -> None:
        given = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ValueError("structured_outputs must set exactly one of json, json_object, regex, choice and "
                             f"grammar, got {', '.join(given) if given else 'none'}")
        if self.json is not None:
            if isinstance(self.json, str):
                try:
                    self.json = json.loads(self.json)
                except ValueError as exc:
                    raise ValueError(f"structured_outputs.json is not valid JSON: {exc}") from None
            if not isinstance(self.json, (dict, bool)):
                raise ValueError(f"structured_outputs.json must be a JSON schema (an object), got "
                                 f"{type(self.json).__name__}")
        if self.json_object is not None and self.json_object is not True:
            raise ValueError(f"structured_outputs.json_object must be true, got {self.json_object!r}")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"structured_outputs.{name} must be a non-empty string, got {value!r}")
        if self.choice is not None:
            c = self.choice
            if not isinstance(c, (list, tuple)) or not c or any(not isinstance(x, str) or not x for x in c):
                raise ValueError(f"structured_outputs.choice must be a non-empty list of non-empty strings, got {c!r}")
            self.choice = list(c)
        if not isinstance(self.disable_any_whitespace, bool):
            raise ValueError("structured_outputs.disable_any_whitespace must be a bool")

    @property
    def kind(self) -> str:
        """Which constraint this is: one of ``KINDS``."""
        return next(k for k in KINDS if getattr(self, k) not in (None, False))

    def key(self) -> tuple[str, str, bool]:
        """A hashable key of the constraint: equal keys compile to the same grammar (the cache's key)."""
        value = getattr(self, self.kind)
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False)
        return self.kind, text, self.disable_any_whitespace

    def starting_after(self, token_ids, opened_by: int | None = None) -> StructuredOutputsParams:
        """A copy of this constraint whose grammar starts after the output ends with ``token_ids`` (non-empty; the
        reasoning's end marker). With ``opened_by`` (the reasoning's start marker, one token) only if the output
        opens with that token, which its first step then allows beside the grammar's tokens; else the grammar
        applies from the first token."""
        ids = tuple(token_ids)
        if not ids or not all(_is_token_id(t) for t in ids):
            raise ValueError(f"structured_outputs.starts_after must be a non-empty list of token ids, got {ids!r}")
        if opened_by is not None and not _is_token_id(opened_by):
            raise ValueError(f"structured_outputs.opened_by must be a token id, got {opened_by!r}")
        out = copy.copy(self)
        out.starts_after, out.opened_by = ids, opened_by
        return out


def _is_token_id(t) -> bool:
    return isinstance(t, int) and not isinstance(t, bool) and t >= 0
