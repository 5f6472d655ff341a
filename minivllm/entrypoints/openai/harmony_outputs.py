"""Reading a gpt-oss chat completion (OpenAI's harmony format, ``tool_parsers/harmony.py``) back into OpenAI's message, whole
or as stream deltas: ``analysis`` is the reasoning, the answer the content, ``functions.NAME`` messages the tool
calls. The interface is ``ChatOutputReader``'s, which the chat handler uses for other models.

The server reads outputs as harmony when it runs ``--reasoning-parser openai_gptoss`` (or ``gpt_oss``) or
``--tool-call-parser openai``. The reasoning is reported with the reasoning parser only (and left out with
``include_reasoning: false``); calls are reported when the request has tools and a tool choice other than
``none`` (under ``none`` a call the model makes anyway is dropped, as its text is no answer). A forced tool
choice (``required``, a named function) is a grammar of one harmony call (``structured.harmony_call_grammar``),
so its output reads back through the same rules.
"""

from __future__ import annotations

from minivllm.entrypoints.openai import responses as R
from minivllm.entrypoints.openai.chat_outputs import delta_calls
from minivllm.entrypoints.openai.protocol import ToolChoice
from minivllm.entrypoints.openai.tool_parsers.harmony import (
    HarmonyStreamer,
    count_reasoning_tokens,
    parse_harmony,
)


class HarmonyOutputReader:
    """How one request's harmony completions are read: ``message(text)`` for a whole one, ``streamer()`` per
    streamed choice. ``tool_choice``: the request's (``none`` without tools); ``reasoning``: whether the server
    reports reasoning (a harmony reasoning parser); ``include_reasoning``: the request's."""

    #: a harmony prompt decides nothing about reasoning, and a forced call's grammar starts at the first token
    thinking = None
    reasoning_markers = None

    def __init__(self, tool_choice: ToolChoice, reasoning: bool, include_reasoning: bool = True):
        self.calls = tool_choice != "none"
        self.reasoning = reasoning
        self.show_reasoning = reasoning and include_reasoning

    def reasoning_tokens(self, token_ids: list[int], decode) -> int:
        """How many of a completion's tokens are reasoning (0 without a reasoning parser)."""
        if not self.reasoning:
            return 0
        return count_reasoning_tokens(token_ids, lambda t: decode([t]))

    def message(self, text: str) -> R.AssistantMessage:
        """The assistant message of a whole completion's text."""
        parsed = parse_harmony(text)
        calls = [R.ToolCall(id=c.id, function=R.FunctionCall(name=c.name, arguments=c.arguments))
                 for c in parsed.calls] if self.calls else []
        return R.AssistantMessage(content=parsed.content, tool_calls=calls,
                                  reasoning=parsed.reasoning if self.show_reasoning else None)

    def streamer(self) -> HarmonyChoiceStreamer:
        """A fresh incremental reader for one streamed choice."""
        return HarmonyChoiceStreamer(self)


class HarmonyChoiceStreamer:
    """One streamed choice: ``feed(delta_text)`` and ``finish()`` give the ``DeltaMessage`` to send (None: nothing
    yet); ``num_calls`` says whether the choice called tools (its finish reason is then ``tool_calls``)."""

    def __init__(self, reader: HarmonyOutputReader):
        self.reader = reader
        self._harmony = HarmonyStreamer()
        self.num_calls = 0

    def feed(self, text: str) -> R.DeltaMessage | None:
        """The delta of the next piece of the completion."""
        return self._delta(self._harmony.feed(text))

    def finish(self) -> R.DeltaMessage | None:
        """The delta of what was held back when the completion ended."""
        return self._delta(self._harmony.finish())

    def _delta(self, out) -> R.DeltaMessage | None:
        r = self.reader
        reasoning = out.reasoning if r.show_reasoning else ""
        calls = None
        if r.calls:
            self.num_calls = self._harmony.num_calls
            calls = delta_calls(out.calls)
        if not reasoning and not out.content and not calls:
            return None
        return R.DeltaMessage(reasoning=reasoning or None, content=out.content or None, tool_calls=calls)
