"""The tool-call parser interface: a finished call, one streamed piece of a call, and the two abstract classes
a parser implements, one for a whole output (``extract``) and one for an output arriving in deltas."""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass


def new_call_id() -> str:
    """A fresh OpenAI-style tool-call id: ``"call_"`` and 24 hex characters."""
    return "call_" + uuid.uuid4().hex[:24]


@dataclass
class ToolCall:
    """One complete tool call found in a model's output, in the shape OpenAI's ``message.tool_calls`` needs.

    ``arguments`` is the JSON text of an object (``json.dumps`` of the parsed arguments, non-ASCII kept), so a
    client can always ``json.loads`` it; ``id`` is minted by the parser (models do not emit one).
    """

    name: str
    arguments: str
    id: str


@dataclass
class ToolCallDelta:
    """One streamed piece of tool call number ``index``, in the shape of OpenAI's ``delta.tool_calls[i]``.

    ``id`` and ``name`` are set on the first piece of a call only; ``arguments`` is a fragment of the
    arguments' JSON text (the fragments of one call, joined, are that text).
    """

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


class ToolStreamer(ABC):
    """The incremental state of one output (one choice) being parsed as it is generated.

    Whatever the split of an output into deltas, the content and calls a streamer emits agree with the
    parser's ``extract`` of the whole output (see the parser classes for the exact statement).
    """

    @abstractmethod
    def feed(self, delta: str) -> tuple[str, list[ToolCallDelta]]:
        """Take the next piece of generated text; return the content text and call pieces decided by it."""

    @abstractmethod
    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        """The output is complete: return what was held back (text that could have begun a call)."""

    @property
    @abstractmethod
    def num_calls(self) -> int:
        """How many calls the stream has started (been sent the first piece of) so far."""


class ToolParser(ABC):
    """Finds tool calls in a model's output text, for one output format (one model family).

    Parsers never raise on model output: a block that is not a well-formed call stays in the content (the
    one exception, a call cut off or broken after its name was streamed, is in each parser's docstring).
    """

    @abstractmethod
    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """Split a whole output into ``(content, calls)``; content is ``None`` when it is empty."""

    @abstractmethod
    def streamer(self) -> ToolStreamer:
        """A fresh incremental parser for one output that arrives in deltas."""
