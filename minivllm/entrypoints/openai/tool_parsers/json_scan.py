"""An incremental scanner that finds where a JSON object (or array) ends in text that arrives in pieces,
honoring strings and escapes, so a streaming parser can pass the raw characters of a value on as they come
and stop exactly at its closing bracket."""

from __future__ import annotations

import re

#: inside a string only a quote (its end) or a backslash (an escape) matters
_STRING_STOP = re.compile(r'["\\]')
#: characters a JSON text may have outside strings, besides brackets and quotes
_BARE = frozenset(" \t\n\r,:-+.0123456789eEtruefalsn")
_CLOSER = {"{": "}", "[": "]"}


class JsonScanner:
    """Scans one JSON object or array, fed in pieces, and says where it ends.

    The scanner tracks string / escape state and a stack of open brackets. It is also a light validity
    check: a character no JSON text can have outside a string (``<``, a letter outside ``true`` /
    ``false`` / ``null``, a mismatched bracket) makes the value *broken*. It does not check the full
    grammar; ``json.loads`` of the complete value does that.
    """

    def __init__(self) -> None:
        self._stack: list[str] = []  # the closers expected, innermost last
        self._in_string = False
        self._escape = False
        self.done = False  # the value's closing bracket has been consumed
        self.broken = False  # a character that cannot be in this JSON text was met (and not consumed)

    def feed(self, text: str) -> int:
        """Consume ``text`` and return how many of its characters belong to the value.

        Fewer than ``len(text)`` only when the value ended (``done``: the count includes the closing bracket)
        or broke (``broken``: the offending character is not counted); afterwards ``feed`` consumes nothing.
        """
        if self.done or self.broken:
            return 0
        i, n = 0, len(text)
        while i < n:
            if self._in_string:
                if self._escape:
                    self._escape = False
                    i += 1
                    continue
                m = _STRING_STOP.search(text, i)
                if m is None:
                    return n
                i = m.start()
                if text[i] == "\\":
                    self._escape = True
                else:
                    self._in_string = False
                i += 1
                continue
            c = text[i]
            if not self._stack and c not in _CLOSER:  # the value must start with its opening bracket
                self.broken = True
                return i
            if c == '"':
                self._in_string = True
            elif c in _CLOSER:
                self._stack.append(_CLOSER[c])
            elif c in "}]":
                if self._stack[-1] != c:
                    self.broken = True
                    return i
                self._stack.pop()
                if not self._stack:
                    self.done = True
                    return i + 1
            elif c not in _BARE:
                self.broken = True
                return i
            i += 1
        return n
