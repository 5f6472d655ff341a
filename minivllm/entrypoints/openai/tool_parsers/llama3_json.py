"""Llama 3.x JSON tool calls::

    <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", ...}

Rules (the same for ``extract`` and the streamer):

* After optional whitespace and an optional ``<|python_tag|>`` (and whitespace), an output that does not
  start with ``{`` is all content (``.strip()``-ed, ``None`` when empty), the tag included.
* Otherwise it is a sequence of JSON objects separated by ``;`` and whitespace. An object beginning like
  ``{"name": "f", "parameters": {`` (or ``"arguments"``) is a *committed* call, valid when its arguments
  object is complete and valid JSON; the rest of the object after it is skipped. Any other object is
  parsed whole (key order free, missing parameters are ``{}``); when that fails (a JSON answer such as
  ``{"city": "Paris"}``) its raw text is content.
* What follows the objects (text that is not ``;``, whitespace or another ``{``), or an uncommitted object
  that breaks (a character no JSON can have there) or is cut off, makes the rest of the output content.

As for Hermes, a committed call cut off or with invalid arguments JSON is in neither the calls nor the
content of ``extract``, while a stream has already sent its name and raw fragments.
"""

from __future__ import annotations

from minivllm.entrypoints.openai.tool_parsers.base import (
    ToolCall,
    ToolParser,
    new_call_id,
)
from minivllm.entrypoints.openai.tool_parsers.call_json import (
    FAILED,
    MATCHED,
    dump_arguments,
    loads_object,
    match_call_head,
    parse_call,
)
from minivllm.entrypoints.openai.tool_parsers.json_scan import JsonScanner
from minivllm.entrypoints.openai.tool_parsers.stream_out import BufferedStreamer

TAG = "<|python_tag|>"


def _tail_scanner() -> JsonScanner:
    """A scanner in the state of a call object right after its arguments object (one ``{`` open)."""
    scanner = JsonScanner()
    scanner.feed("{")
    return scanner


def _skip_separators(text: str, pos: int) -> int:
    """The first position at or after ``pos`` that is not whitespace or ``;``."""
    while pos < len(text) and (text[pos] == ";" or text[pos].isspace()):
        pos += 1
    return pos


class Llama3JsonToolParser(ToolParser):
    """JSON tool calls as Llama 3.1 / 3.2 / 3.3 emit them (module docstring: the rules)."""

    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """``(content, calls)`` of a whole output."""
        rest = text.lstrip()
        if rest.startswith(TAG):
            rest = rest[len(TAG):].lstrip()
        if not rest.startswith("{"):
            return text.strip() or None, []
        content: list[str] = []
        calls: list[ToolCall] = []
        pos = len(text) - len(rest)
        while pos < len(text):
            if text[pos] != "{":
                content.append(text[pos:])
                break
            outer = JsonScanner()
            stop = pos + outer.feed(text[pos:])
            head = match_call_head(text[pos:stop])
            if head.state == MATCHED:
                a0 = pos + head.args_start
                scanner = JsonScanner()
                a1 = a0 + scanner.feed(text[a0:])
                if not scanner.done:  # cut off (nothing more) or broken (the rest is content)
                    content.append(text[a1:])
                    break
                args = loads_object(text[a0:a1])
                if args is not None:
                    calls.append(ToolCall(head.name, dump_arguments(args), new_call_id()))
                tail = _tail_scanner()
                stop = a1 + tail.feed(text[a1:])
                if not tail.done:
                    content.append(text[stop:])
                    break
            elif outer.done:
                call = parse_call(text[pos:stop])
                if call is None:
                    content.append(text[pos:stop])
                else:
                    calls.append(ToolCall(call[0], dump_arguments(call[1]), new_call_id()))
            else:
                content.append(text[pos:])
                break
            pos = _skip_separators(text, stop)
        return "".join(content).strip() or None, calls

    def streamer(self) -> Llama3JsonToolStreamer:
        """A fresh incremental parser for one output."""
        return Llama3JsonToolStreamer()


_START, _OBJECT, _ARGS, _TAIL, _SEP, _REST = range(6)


class Llama3JsonToolStreamer(BufferedStreamer):
    """Streams one Llama 3 output: decides content vs calls at the first non-whitespace character (holding a
    partial ``<|python_tag|>``), then sends each call's name once its head is matched and the raw characters
    of its parameters object as they arrive.

    ``_buf`` holds text not yet consumed; ``_obj`` the uncommitted object so far (fed to ``_scan``).
    """

    def __init__(self) -> None:
        super().__init__()
        self._state = _START
        self._obj = ""
        self._scan = JsonScanner()
        self._failed = False  # the current object's head can no longer match

    def _flush(self) -> None:
        """Held text is content (the start, or an object cut off before it was committed)."""
        if self._state in (_START, _OBJECT, _REST):
            self._out.content(self._obj + self._buf)
        self._buf = self._obj = ""

    def _start(self) -> bool:
        """In START: decide content vs calls if the text so far allows it (True when decided)."""
        rest = self._buf.lstrip()
        if rest.startswith(TAG):
            rest = rest[len(TAG):].lstrip()
        elif TAG.startswith(rest):  # also true of an empty rest (only whitespace so far)
            return False
        if not rest:
            return False
        if rest.startswith("{"):
            self._buf, self._state = rest, _OBJECT
        else:
            self._state = _REST
        return True

    def _run(self) -> None:
        while self._buf:
            if self._state == _START:
                if not self._start():
                    return
            elif self._state == _OBJECT:
                n = self._scan.feed(self._buf)
                self._obj, self._buf = self._obj + self._buf[:n], self._buf[n:]
                head = match_call_head(self._obj) if not self._failed else None
                if head is not None and head.state == MATCHED:
                    self._out.start_call(head.name)
                    self._buf = self._obj[head.args_start:] + self._buf
                    self._obj, self._state, self._scan = "", _ARGS, JsonScanner()
                    continue
                self._failed = head is None or head.state == FAILED
                if self._scan.done:
                    call = parse_call(self._obj)
                    if call is None:
                        self._out.content(self._obj)
                    else:
                        self._out.start_call(call[0])
                        self._out.arguments(dump_arguments(call[1]))
                    self._obj, self._state = "", _SEP
                elif self._scan.broken:
                    self._buf, self._obj, self._state = self._obj + self._buf, "", _REST
            elif self._state in (_ARGS, _TAIL):
                n = self._scan.feed(self._buf)
                if self._state == _ARGS:
                    self._out.arguments(self._buf[:n])
                self._buf = self._buf[n:]
                if self._scan.broken:
                    self._state = _REST
                elif self._scan.done:
                    args_done = self._state == _ARGS
                    self._state, self._scan = (_TAIL, _tail_scanner()) if args_done else (_SEP, JsonScanner())
            elif self._state == _SEP:
                i = _skip_separators(self._buf, 0)
                self._buf = self._buf[i:]
                if self._buf:
                    self._state = _OBJECT if self._buf[0] == "{" else _REST
                    self._obj, self._scan, self._failed = "", JsonScanner(), False
            else:  # _REST: everything left is content
                self._out.content(self._buf)
                self._buf = ""
