"""Reading a chat completion's text back into OpenAI's message: the reasoning (``--reasoning-parser``), the
content, and the tool calls, whole or as stream deltas.

Where the calls come from depends on ``tool_choice``: ``auto`` parses the model's own call syntax
(``--tool-call-parser``); a named function's output is its arguments object and ``required``'s a JSON array of
``{"name", "parameters"}`` (both forced by the request's grammar, see ``structured.py``); ``none`` reads nothing.
A named function's call is returned even when ``max_tokens`` cut its arguments short (as in vLLM, whole or
streamed); a ``required`` output cut short cannot be split into calls, and comes back as content.

With a reasoning parser, unless the prompt closed the think block, the model may reason before the request's
grammar applies (``structured.after_reasoning``): the reasoning is split off first, and the content, the forced
call(s) included, is read from the rest. With thinking off a forced call's grammar starts at the first token,
and its whole output is the call.

gpt-oss's harmony outputs are read by ``harmony_outputs.HarmonyOutputReader``, which has this reader's interface.
"""

from __future__ import annotations

import json
import uuid

from minivllm.entrypoints.openai import responses as R
from minivllm.entrypoints.openai.protocol import NamedToolChoice, ToolChoice
from minivllm.entrypoints.openai.reasoning import REASONING_PARSERS
from minivllm.entrypoints.openai.tool_parsers import TOOL_PARSERS, ToolCallDelta


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def delta_calls(deltas: list[ToolCallDelta]) -> list[R.DeltaToolCall] | None:
    """A stream's tool-call pieces in OpenAI's delta shape (None when there are none)."""
    out = [R.DeltaToolCall(index=d.index, id=d.id, type="function" if d.id else None,
                           function=R.DeltaFunctionCall(name=d.name, arguments=d.arguments))
           for d in deltas if d.id or d.name or d.arguments]
    return out or None


class ChatOutputReader:
    """How one request's completions are read: ``message(text)`` for a whole one, ``streamer()`` per streamed
    choice. ``tool_parser`` / ``reasoning_parser``: the server's parser names (None: off); ``prompt_tail``: the
    end of the rendered prompt (whether the template opened or closed a think block)."""

    def __init__(self, tool_choice: ToolChoice, tool_parser: str | None, reasoning_parser: str | None,
                 prompt_tail: str = "", include_reasoning: bool = True):
        self.named = tool_choice.function.name if isinstance(tool_choice, NamedToolChoice) else None
        self.required = tool_choice == "required"
        self.tool_parser = TOOL_PARSERS[tool_parser]() if tool_choice == "auto" and tool_parser else None
        parser = REASONING_PARSERS[reasoning_parser]() if reasoning_parser else None
        # what the prompt decided: a template may open the think block itself, or close it (thinking off)
        self.thinking = parser.thinking_from_prompt(prompt_tail) if parser is not None else None
        # with thinking off, a forced call's grammar starts at the first token: its whole output is the call
        forced = self.named is not None or self.required
        self.reasoning = parser if parser is not None and (not forced or self.thinking is not False) else None
        self.include_reasoning = include_reasoning  # false: the reasoning is split off, then left out

    @property
    def reasoning_markers(self) -> tuple[str, str] | None:
        """The reasoning's start and end markers, where the model may reason before the request's grammar applies
        (a reasoning parser, and a prompt that did not close the think block); None: it applies at once."""
        if self.reasoning is None or self.thinking is False:
            return None
        return self.reasoning.reasoning_start_str, self.reasoning.reasoning_end_str

    def reasoning_tokens(self, token_ids: list[int], decode) -> int:
        """How many of a completion's tokens are reasoning (0 without a reasoning parser)."""
        if self.reasoning is None:
            return 0
        return self.reasoning.count_tokens(token_ids, decode, thinking=self.thinking)

    def message(self, text: str) -> R.AssistantMessage:
        """The assistant message of a whole completion's text."""
        reasoning, content = (self.reasoning.extract(text, thinking=self.thinking) if self.reasoning is not None
                              else (None, text))
        calls: list[R.ToolCall] = []
        if self.reasoning is not None and (self.named is not None or self.required):
            text = content or ""  # the forced call(s) follow the reasoning; none when it was cut short
            if not text:
                return R.AssistantMessage(content=None, reasoning=reasoning if self.include_reasoning else None)
        if self.named is not None:
            calls, content = self._forced([{"name": self.named, "parameters": _loads(text)}], text)
            if not calls:  # cut short (finish_reason length): still the call, with the arguments so far, as vLLM
                call = R.ToolCall(id=_call_id(), function=R.FunctionCall(name=self.named, arguments=text))
                calls, content = [call], None
        elif self.required:
            calls, content = self._forced(_loads(text), text)
        elif self.tool_parser is not None and content:
            content, parsed = self.tool_parser.extract(content)
            calls = [R.ToolCall(id=c.id, function=R.FunctionCall(name=c.name, arguments=c.arguments)) for c in parsed]
        return R.AssistantMessage(content=content, reasoning=reasoning if self.include_reasoning else None,
                                  tool_calls=calls)

    @staticmethod
    def _forced(items, text: str) -> tuple[list[R.ToolCall], str | None]:
        """The calls of a grammar-forced output; its text as content when it did not complete (``length``)."""
        if not isinstance(items, list) or not all(isinstance(c, dict) and isinstance(c.get("parameters"), dict)
                                                  for c in items):
            return [], text
        return [R.ToolCall(id=_call_id(), function=R.FunctionCall(
            name=c["name"], arguments=json.dumps(c["parameters"], ensure_ascii=False))) for c in items], None

    def streamer(self) -> ChoiceStreamer:
        return ChoiceStreamer(self)


class ChoiceStreamer:
    """One streamed choice: ``feed(delta_text)`` and ``finish()`` give the ``DeltaMessage`` to send (None: nothing
    yet); ``num_calls`` says whether the choice called tools (its finish reason is then ``tool_calls``)."""

    def __init__(self, reader: ChatOutputReader):
        self.reader = reader
        self.reasoning = reader.reasoning.streamer(thinking=reader.thinking) if reader.reasoning is not None else None
        self.tools = reader.tool_parser.streamer() if reader.tool_parser is not None else None
        self.buffer = ""  # a required choice's JSON array, read when it is complete
        self.num_calls = 0
        self._named_id = _call_id() if reader.named is not None else None

    def feed(self, text: str) -> R.DeltaMessage | None:
        return self._step(text, final=False)

    def finish(self) -> R.DeltaMessage | None:
        return self._step("", final=True)

    def _step(self, text: str, final: bool) -> R.DeltaMessage | None:
        r = self.reader
        reasoning, content = "", text
        if self.reasoning is not None:
            reasoning, content = self.reasoning.finish() if final else self.reasoning.feed(text)
            reasoning = reasoning if r.include_reasoning else ""
        if r.named is not None or r.required:
            delta = self._forced_delta(content, final)
            if reasoning:
                delta = delta or R.DeltaMessage()
                delta.reasoning = reasoning
            return delta
        calls = None
        if self.tools is not None:
            fed, deltas = self.tools.feed(content) if content else ("", [])
            if final:
                more, last = self.tools.finish()
                fed, deltas = fed + more, deltas + last
            content, calls = fed, delta_calls(deltas)
            self.num_calls = self.tools.num_calls
        if not reasoning and not content and not calls:
            return None
        return R.DeltaMessage(reasoning=reasoning or None, content=content or None, tool_calls=calls)

    def _forced_delta(self, text: str, final: bool) -> R.DeltaMessage | None:
        """The delta of a forced call's output (``text``: its next piece, after any reasoning). A named call
        streams its arguments as they come (its first delta names it); a ``required`` array is read once whole."""
        r = self.reader
        if r.named is not None:
            first = self.num_calls == 0
            if first and not text and self.reasoning is not None:
                return None  # the call starts with the text after the reasoning (none: it was cut short)
            self.num_calls = 1
            if not text and not first:
                return None
            return R.DeltaMessage(tool_calls=[R.DeltaToolCall(
                index=0, id=self._named_id if first else None, type="function" if first else None,
                function=R.DeltaFunctionCall(name=r.named if first else None, arguments=text))])
        self.buffer += text
        if not final:
            return None
        calls, content = r._forced(_loads(self.buffer), self.buffer)
        self.num_calls = len(calls)
        if content is not None:
            return R.DeltaMessage(content=content) if content else None
        return R.DeltaMessage(tool_calls=[R.DeltaToolCall(
            index=i, id=c.id, type="function",
            function=R.DeltaFunctionCall(name=c.function.name, arguments=c.function.arguments))
            for i, c in enumerate(calls)])


def _loads(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None
