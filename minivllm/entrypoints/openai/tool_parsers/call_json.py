"""The JSON shape of one tool call, ``{"name": "f", "arguments": {...}}`` (``"parameters"`` accepted too):
recognizing its head early (so a stream can send the name before the arguments are complete) and parsing a
whole call object.

A stream commits to a call when ``match_call_head`` says MATCHED, that is once the name is complete and
the arguments value is known to be an object (its ``{`` is seen), a few characters after the name; earlier,
the call could still turn out malformed (arguments not an object) and a sent name cannot be taken back.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

MATCHED, PENDING, FAILED = "matched", "pending", "failed"
_WS = " \t\n\r"
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
#: a name string longer than this is not a function name (and a stream stops re-matching an endless one)
MAX_NAME_CHARS = 512


@dataclass(frozen=True)
class CallHead:
    """How a text's beginning matches ``{"name": "<name>", "arguments": {`` (JSON whitespace allowed
    between tokens, ``"parameters"`` for ``"arguments"``): MATCHED with the name and the index of the
    arguments' ``{``; PENDING when the text is a prefix of such a head; FAILED when it cannot become one.

    NOTE: the result is monotone in the text: once MATCHED or FAILED, every extension of the text gives
    the same answer, which is what makes a stream's decision independent of how the text was split.
    """

    state: str
    name: str = ""
    args_start: int = -1


def _literal(text: str, pos: int, options: tuple[str, ...]) -> int | str:
    """The position after whichever of ``options`` starts at ``pos`` (after JSON whitespace), or a state."""
    while pos < len(text) and text[pos] in _WS:
        pos += 1
    rest = text[pos:pos + max(map(len, options))]
    for lit in options:
        if rest.startswith(lit):
            return pos + len(lit)
    return PENDING if any(lit.startswith(rest) for lit in options) else FAILED


def _name(text: str, pos: int) -> tuple[int, str] | str:
    """``(position after, value)`` of the JSON string at ``pos`` (after whitespace), or a state."""
    while pos < len(text) and text[pos] in _WS:
        pos += 1
    if pos == len(text):
        return PENDING
    if text[pos] != '"':
        return FAILED
    m = _STRING.match(text, pos)
    if m is None:
        return FAILED if len(text) - pos > MAX_NAME_CHARS + 2 else PENDING
    if m.end() - pos > MAX_NAME_CHARS + 2:
        return FAILED
    try:
        name = json.loads(m.group())
    except ValueError:  # a bad escape or a control character
        return FAILED
    return (m.end(), name) if name else FAILED


def match_call_head(text: str) -> CallHead:
    """Match the head of a call object at the start of ``text`` (leading JSON whitespace allowed)."""
    pos = _literal(text, 0, ("{",))
    for options in ('"name"',), (":",):
        if isinstance(pos, str):
            return CallHead(pos)
        pos = _literal(text, pos, options)
    if isinstance(pos, str):
        return CallHead(pos)
    got = _name(text, pos)
    if isinstance(got, str):
        return CallHead(got)
    pos, name = got
    for options in (",",), ('"arguments"', '"parameters"'), (":",), ("{",):
        pos = _literal(text, pos, options)
        if isinstance(pos, str):
            return CallHead(pos)
    return CallHead(MATCHED, name, pos - 1)


def _no_constant(token: str):
    raise ValueError(f"{token} is not JSON")


def loads_object(text: str) -> dict | None:
    """``text`` parsed as a JSON object, or ``None`` when it is not one (``NaN`` / ``Infinity`` refused)."""
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError):  # RecursionError: absurdly deep nesting in model output
        return None
    return value if isinstance(value, dict) else None


def parse_call(text: str) -> tuple[str, dict] | None:
    """``(name, arguments)`` of a whole call object (surrounding whitespace allowed), or ``None`` when it is
    not one: not a JSON object, no non-empty string ``"name"``, or arguments present but not an object.
    Missing arguments are ``{}`` (a function without parameters)."""
    obj = loads_object(text.strip())
    if obj is None or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return (obj["name"], args) if isinstance(args, dict) else None


def dump_arguments(args: dict) -> str:
    """The arguments' JSON text, non-ASCII kept as is (``\\u`` escapes where a lone surrogate makes the
    text impossible to encode as UTF-8)."""
    text = json.dumps(args, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(args)
    return text
