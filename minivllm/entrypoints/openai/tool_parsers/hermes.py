"""Hermes-style tool calls, as Qwen2.5 / Qwen3 emit them::

    Let me check.
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Rules (the same for ``extract`` and the streamer):

* A block starts at ``<tool_call>`` and ends at the next ``</tool_call>`` (consumed) or ``<tool_call>`` (the
  next block), or at the end of the text (generation cut off).
* A block whose body begins like ``{"name": "f", "arguments": {`` is a *committed* call: its arguments
  object's end is found by scanning JSON (so tags inside argument strings are text); the call is valid
  when that object is complete and valid JSON; the rest of the block after it is ignored.
* Any other block is parsed whole (key order free, missing arguments are ``{}``); when that fails it is
  malformed and its raw text, tags included, stays in the content (other blocks are still calls).
* Content is the text outside calls, ``.strip()``-ed, ``None`` when empty.

A committed call whose arguments are cut off or invalid JSON is in neither the calls nor the content
of ``extract``; a stream has already sent its name and raw fragments (whose join does not parse as a JSON
object). It is the one place where stream and ``extract`` differ, and it cannot be otherwise without
holding every call back until it is complete.
"""

from __future__ import annotations

import re

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
from minivllm.entrypoints.openai.tool_parsers.stream_out import BufferedStreamer, held_suffix

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_MARK = re.compile(r"</?tool_call>")  # what ends a block: its closing tag or the next block's opening tag


def _block_end(text: str, pos: int) -> tuple[int, int]:
    """``(end of the body, start of what follows the block)`` for a block whose body runs from ``pos``."""
    m = _MARK.search(text, pos)
    if m is None:
        return len(text), len(text)
    return m.start(), m.end() if m.group() == CLOSE else m.start()


class HermesToolParser(ToolParser):
    """Tool calls in ``<tool_call>`` blocks, for Qwen2.5 / Qwen3 and other Hermes-format models."""

    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """``(content, calls)`` of a whole output (module docstring: the rules)."""
        content: list[str] = []
        calls: list[ToolCall] = []
        pos = 0
        while pos < len(text):
            i = text.find(OPEN, pos)
            if i < 0:
                content.append(text[pos:])
                break
            content.append(text[pos:i])
            start = i + len(OPEN)
            body_end, pos = _block_end(text, start)
            head = match_call_head(text[start:body_end])
            if head.state == MATCHED:
                a0 = start + head.args_start
                scanner = JsonScanner()
                a1 = a0 + scanner.feed(text[a0:])
                args = loads_object(text[a0:a1]) if scanner.done else None
                if args is not None:
                    calls.append(ToolCall(head.name, dump_arguments(args), new_call_id()))
                pos = _block_end(text, a1)[1]
                continue
            call = parse_call(text[start:body_end])
            if call is None:
                content.append(text[i:pos])
            else:
                calls.append(ToolCall(call[0], dump_arguments(call[1]), new_call_id()))
        return "".join(content).strip() or None, calls

    def streamer(self) -> HermesToolStreamer:
        """A fresh incremental parser for one output."""
        return HermesToolStreamer()


_TEXT, _HEAD, _HOLD, _ARGS, _TAIL = range(5)


class HermesToolStreamer(BufferedStreamer):
    """Streams one Hermes-format output: content as soon as it cannot begin ``<tool_call>``, a call's name
    once its head is matched, then the raw characters of its arguments object as they arrive.

    ``_buf`` holds the text not yet decided: in TEXT a partial ``<tool_call>``; in HEAD / HOLD the block's
    body so far; in ARGS nothing between feeds; in TAIL the text after the arguments, searched for the end
    of the block.
    """

    def __init__(self) -> None:
        super().__init__()
        self._state = _TEXT
        self._search_from = 0  # where the next search of _buf for a block-ending tag starts
        self._args = JsonScanner()

    def _flush(self) -> None:
        """A partial tag is content; an unfinished uncommitted block is resolved (unclosed)."""
        if self._state == _TEXT:
            self._out.content(self._buf)
        elif self._state in (_HEAD, _HOLD):
            self._resolve(self._buf, closed=False)
        self._buf = ""

    def _find_mark(self) -> re.Match | None:
        m = _MARK.search(self._buf, self._search_from)
        if m is None:
            self._search_from = max(0, len(self._buf) - len(CLOSE) + 1)
        return m

    def _resolve(self, body: str, closed: bool) -> None:
        """An uncommitted block is complete: a call if it parses as one, else its raw text is content."""
        call = parse_call(body)
        if call is None:
            self._out.content(OPEN + body + (CLOSE if closed else ""))
        else:
            self._out.start_call(call[0])
            self._out.arguments(dump_arguments(call[1]))

    def _end_block(self, m: re.Match) -> None:
        """Go back to TEXT after the block that ``m`` (a tag found in ``_buf``) ends."""
        self._buf = self._buf[m.end() if m.group() == CLOSE else m.start():]
        self._state, self._search_from = _TEXT, 0

    def _run(self) -> None:
        while True:
            if self._state == _TEXT:
                i = self._buf.find(OPEN)
                if i < 0:
                    keep = len(self._buf) - held_suffix(self._buf, OPEN)
                    self._out.content(self._buf[:keep])
                    self._buf = self._buf[keep:]
                    return
                self._out.content(self._buf[:i])
                self._buf, self._state, self._search_from = self._buf[i + len(OPEN):], _HEAD, 0
            elif self._state in (_HEAD, _HOLD):
                m = self._find_mark()
                if self._state == _HEAD:
                    head = match_call_head(self._buf if m is None else self._buf[:m.start()])
                    if head.state == MATCHED:
                        self._out.start_call(head.name)
                        self._buf, self._state, self._args = self._buf[head.args_start:], _ARGS, JsonScanner()
                        continue
                    if head.state == FAILED:
                        self._state = _HOLD  # no re-matching: FAILED is final (CallHead is monotone)
                if m is None:
                    return
                self._resolve(self._buf[:m.start()], closed=m.group() == CLOSE)
                self._end_block(m)
            elif self._state == _ARGS:
                n = self._args.feed(self._buf)
                self._out.arguments(self._buf[:n])
                self._buf = self._buf[n:]
                if not (self._args.done or self._args.broken):
                    return
                self._state, self._search_from = _TAIL, 0
            else:  # _TAIL: the text after a committed call's arguments is dropped up to the block's end
                m = self._find_mark()
                if m is None:
                    self._buf = self._buf[self._search_from:]
                    self._search_from = 0
                    return
                self._end_block(m)
