"""gpt-oss's tool calls in OpenAI's harmony format (``--tool-call-parser openai``, vLLM's name)::

    <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>

The rules are ``tool_parsers/harmony.py``'s: a ``functions.NAME`` recipient's body is the call's arguments, verbatim (the
format has no other JSON around them); ``final`` bodies and commentary without a recipient are the content;
``analysis`` (reasoning) is neither (``--reasoning-parser openai_gptoss`` reports it).
"""

from __future__ import annotations

from minivllm.entrypoints.openai.tool_parsers.base import ToolCall, ToolCallDelta, ToolParser, ToolStreamer
from minivllm.entrypoints.openai.tool_parsers.harmony import HarmonyStreamer, parse_harmony


class OpenAIToolParser(ToolParser):
    """Tool calls of gpt-oss's harmony messages (module docstring)."""

    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """``(content, calls)`` of a whole output."""
        message = parse_harmony(text)
        return message.content, message.calls

    def streamer(self) -> OpenAIToolStreamer:
        """A fresh incremental parser for one output."""
        return OpenAIToolStreamer()


class OpenAIToolStreamer(ToolStreamer):
    """Streams one harmony output's content and calls (a call's name once its header is complete, then its
    arguments as they arrive)."""

    def __init__(self) -> None:
        self._harmony = HarmonyStreamer()

    def feed(self, delta: str) -> tuple[str, list[ToolCallDelta]]:
        """Take the next piece of output; return the content and call pieces it decided."""
        out = self._harmony.feed(delta)
        return out.content, out.calls

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        """End of output: what was held back."""
        out = self._harmony.finish()
        return out.content, out.calls

    @property
    def num_calls(self) -> int:
        """Calls started so far."""
        return self._harmony.num_calls
