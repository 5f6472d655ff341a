"""What one streamed output emits: content with the surrounding whitespace removed exactly as ``str.strip``
would remove it from the whole, and tool-call pieces numbered in order, with the pieces of one call that a
single feed produced merged into one."""

from __future__ import annotations

from abc import abstractmethod

from minivllm.entrypoints.openai.tool_parsers.base import ToolCallDelta, ToolStreamer, new_call_id


def held_suffix(text: str, tag: str) -> int:
    """The length of the longest suffix of ``text`` that is a proper prefix of ``tag`` (text that may still
    become ``tag`` and so must be held back)."""
    for k in range(min(len(text), len(tag) - 1), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


class StrippedText:
    """Streams text pieces so that their concatenation is the concatenation of the inputs, ``.strip()``-ed.

    Leading whitespace is dropped; a whitespace run is held until non-whitespace follows it (and dropped if
    nothing does), so a client never sees whitespace the non-streamed content does not have.
    """

    def __init__(self) -> None:
        self._started = False
        self._held = ""

    def push(self, text: str) -> str:
        """The text to emit now for the next input piece."""
        if not self._started:
            text = text.lstrip()
            if not text:
                return ""
            self._started = True
        body = text.rstrip()
        if not body:
            self._held += text
            return ""
        out = self._held + body
        self._held = text[len(body):]
        return out


class StreamOutput:
    """Collects a streamer's output between two ``take`` calls: content text and tool-call deltas.

    Calls are numbered 0, 1, ... in the order they start; each gets an id here, sent with its name.
    """

    def __init__(self) -> None:
        self._content = StrippedText()
        self._text: list[str] = []
        self._deltas: list[ToolCallDelta] = []
        self.num_calls = 0

    def content(self, text: str) -> None:
        """Add text that is content (not part of any call)."""
        if text:
            self._text.append(self._content.push(text))

    def start_call(self, name: str) -> None:
        """Start the next call: its first delta carries the id and the name."""
        self._deltas.append(ToolCallDelta(index=self.num_calls, id=new_call_id(), name=name))
        self.num_calls += 1

    def arguments(self, fragment: str) -> None:
        """Add a fragment of the arguments text of the call started last."""
        if not fragment:
            return
        index = self.num_calls - 1
        if self._deltas and self._deltas[-1].index == index:
            self._deltas[-1].arguments += fragment
        else:
            self._deltas.append(ToolCallDelta(index=index, arguments=fragment))

    def take(self) -> tuple[str, list[ToolCallDelta]]:
        """What was collected since the last ``take`` (and forget it)."""
        text, deltas = "".join(self._text), self._deltas
        self._text, self._deltas = [], []
        return text, deltas


class BufferedStreamer(ToolStreamer):
    """A streamer that gathers text in ``_buf`` and decides it in ``_run`` (each feed) and ``_flush`` (the
    end of the output), emitting through ``_out``."""

    def __init__(self) -> None:
        self._out = StreamOutput()
        self._buf = ""

    @property
    def num_calls(self) -> int:
        """Calls started so far."""
        return self._out.num_calls

    def feed(self, delta: str) -> tuple[str, list[ToolCallDelta]]:
        """Take the next piece of output; return the content and call pieces it decided."""
        self._buf += delta
        self._run()
        return self._out.take()

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        """End of output: what was held back (see ``_flush``)."""
        self._flush()
        return self._out.take()

    @abstractmethod
    def _run(self) -> None:
        """Decide as much of ``_buf`` as the text so far allows."""

    @abstractmethod
    def _flush(self) -> None:
        """Decide what is still held at the end of the output."""
