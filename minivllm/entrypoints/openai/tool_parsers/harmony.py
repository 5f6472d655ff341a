"""OpenAI's harmony format (gpt-oss's chat format), read back from a completion's text: which parts are
reasoning, which are the answer, which are tool calls, whole or as the text streams. Pure Python.

An assistant turn is a sequence of messages, each ``header<|message|>body`` ended by ``<|end|>``, ``<|call|>``
or ``<|return|>``; a message after the first starts with ``<|start|>``. The header names the role (the
generation prompt already wrote the first one's ``<|start|>assistant``), the channel
(``<|channel|>analysis``) and, for a tool call, the recipient (``to=functions.NAME``, before or after the
channel), e.g. ``<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}``.

Rules (the same for a whole text and a stream, whatever its split; special tokens kept in the text):

* A body is *reasoning* on the ``analysis`` channel; a *call* of ``NAME`` when the recipient is
  ``functions.NAME`` (its body, verbatim, is the call's JSON arguments); ignored for any other recipient
  (a built-in tool's); otherwise (``final``, ``commentary`` without a recipient, no channel) *content*.
* The bodies of a kind are joined as they are (no separator, whitespace kept); an empty one is ``None``.
* A body ends at ``<|end|>``, ``<|call|>``, ``<|return|>``, ``<|start|>`` (a message the model began without
  ending the last) or the end of the text: a call cut off by ``max_tokens`` is still a call, with the
  arguments so far.
* A header is the text before ``<|message|>``, read from its last ``<|start|>``; one the text ends in is
  dropped (it has no body). A header longer than :data:`MAX_HEADER_CHARS` is no harmony: it and all that
  follows are content, verbatim.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from minivllm.entrypoints.openai.tool_parsers.base import ToolCall, ToolCallDelta, new_call_id
from minivllm.entrypoints.openai.tool_parsers.stream_out import held_suffix

START, END, MESSAGE, CHANNEL = "<|start|>", "<|end|>", "<|message|>", "<|channel|>"
RETURN, CALL = "<|return|>", "<|call|>"
#: what ends a message's body (``<|start|>`` stays in the text: it begins the next header)
BODY_ENDS = (END, CALL, RETURN, START)
#: the channel of reasoning, and the recipients' namespace of the request's functions (harmony's ``functions``)
ANALYSIS, FUNCTIONS = "analysis", "functions."
#: a header longer than this without ``<|message|>`` is no harmony (and a stream stops holding it back)
MAX_HEADER_CHARS = 512

REASONING, CONTENT, TOOL_CALL = "reasoning", "content", "call"
_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*([^\s<]+)")
_RECIPIENT = re.compile(r"(?:^|\s|>)to=([^\s<]+)")


@dataclass(frozen=True)
class Header:
    """A message's header: its channel and recipient (``None`` where the header names none)."""

    channel: str | None
    recipient: str | None

    @classmethod
    def parse(cls, text: str) -> Header:
        """The header of the text before ``<|message|>`` (from its last ``<|start|>``)."""
        text = text[text.rfind(START) + len(START):] if START in text else text
        channel, recipient = _CHANNEL.search(text), _RECIPIENT.search(text)
        return cls(channel.group(1) if channel else None, recipient.group(1) if recipient else None)

    @property
    def kind(self) -> str | None:
        """What the body is: ``REASONING``, ``CONTENT``, ``TOOL_CALL`` or ``None`` (ignored)."""
        if self.recipient is not None:
            return TOOL_CALL if self.recipient.startswith(FUNCTIONS) and self.function else None
        return REASONING if self.channel == ANALYSIS else CONTENT

    @property
    def function(self) -> str:
        """The called function's name (``""`` unless the recipient is in the ``functions`` namespace)."""
        return self.recipient[len(FUNCTIONS):] if self.recipient and self.recipient.startswith(FUNCTIONS) else ""


@dataclass
class HarmonyDelta:
    """What one piece of a stream decided: reasoning text, content text, and tool-call pieces (a call's first
    piece has its id and name; the arguments fragments of one call, joined, are its body)."""

    reasoning: str = ""
    content: str = ""
    calls: list[ToolCallDelta] = field(default_factory=list)


@dataclass
class HarmonyMessage:
    """A whole completion read back: reasoning, content (``None`` when empty) and the calls in order."""

    reasoning: str | None
    content: str | None
    calls: list[ToolCall]


_HEADER, _BODY, _RAW = range(3)


class HarmonyStreamer:
    """The incremental state of one completion: body text is passed on as it arrives, holding back only a
    suffix that may be the start of a token that ends the body; a header is held until its ``<|message|>``."""

    def __init__(self) -> None:
        self._buf = ""
        self._consumed = 0  # characters of the completion before ``_buf``
        self._state = _HEADER
        self._kind: str | None = None  # the open message's kind
        self.num_calls = 0
        #: ``(start, end)`` character spans of the completion that are reasoning, in order
        self.reasoning_spans: list[tuple[int, int]] = []

    def feed(self, text: str) -> HarmonyDelta:
        """Take the next piece of the completion; return what it decided."""
        self._buf += text
        return self._run(final=False)

    def finish(self) -> HarmonyDelta:
        """The completion ended: return what was held back."""
        return self._run(final=True)

    def _take(self, n: int) -> str:
        """Remove the first ``n`` characters of ``_buf``, and return them."""
        text, self._buf = self._buf[:n], self._buf[n:]
        self._consumed += n
        return text

    def _emit(self, out: HarmonyDelta, kind: str | None, n: int) -> None:
        """The next ``n`` characters are a body of ``kind``."""
        start = self._consumed
        text = self._take(n)
        if not text or kind is None:
            return
        if kind == REASONING:
            out.reasoning += text
            self.reasoning_spans.append((start, self._consumed))
        elif kind == CONTENT:
            out.content += text
        elif out.calls and out.calls[-1].index == self.num_calls - 1:
            out.calls[-1].arguments += text
        else:
            out.calls.append(ToolCallDelta(index=self.num_calls - 1, arguments=text))

    def _run(self, final: bool) -> HarmonyDelta:
        out = HarmonyDelta()
        while True:
            if self._state == _HEADER:
                i = self._buf.find(MESSAGE)
                # NOTE: past this length no <|message|> can begin within the first MAX_HEADER_CHARS characters
                if i > MAX_HEADER_CHARS or (i < 0 and len(self._buf) >= MAX_HEADER_CHARS + len(MESSAGE)):
                    self._state = _RAW
                    continue
                if i < 0:
                    if final:
                        self._take(len(self._buf))  # a header without a body
                    break
                header = Header.parse(self._take(i + len(MESSAGE))[:i])
                self._state, self._kind = _BODY, header.kind
                if self._kind == TOOL_CALL:
                    out.calls.append(ToolCallDelta(index=self.num_calls, id=new_call_id(), name=header.function))
                    self.num_calls += 1
            elif self._state == _BODY:
                ends = [(j, tag) for tag in BODY_ENDS if (j := self._buf.find(tag)) >= 0]
                if ends:
                    j, tag = min(ends)
                    self._emit(out, self._kind, j)
                    self._take(0 if tag == START else len(tag))
                    self._state = _HEADER
                    continue
                keep = len(self._buf) - (0 if final else max(held_suffix(self._buf, t) for t in BODY_ENDS))
                self._emit(out, self._kind, keep)
                break
            else:
                self._emit(out, CONTENT, len(self._buf))
                break
        return out


def parse_harmony(text: str) -> HarmonyMessage:
    """A whole completion's reasoning, content and calls (module docstring: the rules)."""
    streamer = HarmonyStreamer()
    reasoning, content, calls = [], [], []
    for delta in (streamer.feed(text), streamer.finish()):
        reasoning.append(delta.reasoning)
        content.append(delta.content)
        for d in delta.calls:
            if d.id is not None:
                calls.append(ToolCall(d.name, d.arguments, d.id))
            else:
                calls[d.index].arguments += d.arguments
    return HarmonyMessage("".join(reasoning) or None, "".join(content) or None, calls)


def count_reasoning_tokens(token_ids: list[int], decode_one) -> int:
    """How many of a completion's tokens are in the bodies of its ``analysis`` messages
    (``usage.completion_tokens_details.reasoning_tokens``); ``decode_one`` turns one id into its text, special
    tokens kept. A token is counted when its text starts inside reasoning."""
    pieces = [decode_one(t) for t in token_ids]
    streamer = HarmonyStreamer()
    streamer.feed("".join(pieces))
    streamer.finish()
    spans, count, pos, k = streamer.reasoning_spans, 0, 0, 0
    for piece in pieces:
        while k < len(spans) and spans[k][1] <= pos:
            k += 1
        if piece and k < len(spans) and spans[k][0] <= pos:
            count += 1
        pos += len(piece)
    return count
