"""Reasoning parsers: split a thinking model's output into ``reasoning`` and ``content``, whole or
as it streams. Pure Python.

Qwen3 writes ``<think>\\n...\\n</think>\\n\\nanswer``. Rules (the same for ``extract`` and the streamer):

* A ``<think>`` at the very start is dropped.
* With ``</think>`` (its first occurrence): reasoning is the text before it, content the text after it with
  its leading newlines removed.
* Without ``</think>``: if the text started with ``<think>`` it is all reasoning (thinking cut off by
  ``max_tokens``).
* A text that does not start with ``<think>`` is all content (the model did not think), leading newlines
  removed, tags not interpreted: it streams at once.
* A blank part (empty or whitespace only, e.g. the ``<think>\\n\\n</think>`` of ``/no_think``) is ``None``;
  other parts are kept verbatim.

``thinking`` (``extract`` / ``streamer``) says what the prompt already decided: ``True`` when it opened the
think block (templates that end the prompt with ``<think>\\n``: the text is reasoning until ``</think>``, all
of it if none), ``False`` when thinking is off (all content, tags not interpreted); ``None`` (the default)
applies the rules above. ``thinking_from_prompt`` reads it off a rendered prompt.
"""

from __future__ import annotations

from collections.abc import Callable

from minivllm.entrypoints.openai.tool_parsers.harmony import (
    ANALYSIS,
    CHANNEL,
    END,
    MESSAGE,
    HarmonyStreamer,
    count_reasoning_tokens,
    parse_harmony,
)
from minivllm.entrypoints.openai.tool_parsers.stream_out import held_suffix

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def _part(text: str) -> str | None:
    return None if not text or text.isspace() else text


class _BlankHeld:
    """Streams one part verbatim once it has a non-whitespace character (a blank part is ``None``), after
    dropping the leading characters in ``drop``."""

    def __init__(self, drop: str) -> None:
        self._drop = drop
        self._held = ""
        self._open = False

    def push(self, text: str) -> str:
        """What to emit now for the next piece of this part."""
        if self._open:
            return text
        if not self._held and self._drop:
            text = text.lstrip(self._drop)  # only before the part's first kept character
        self._held += text
        if not self._held or self._held.isspace():
            return ""
        self._open = True
        out, self._held = self._held, ""
        return out


_START, _REASONING, _CONTENT = range(3)


class Qwen3ReasoningStreamer:
    """The incremental state of one output: text is passed on as soon as its part is known, holding back
    only a partial ``<think>`` / ``</think>``."""

    def __init__(self, thinking: bool | None = None) -> None:
        self._thinking = thinking
        self._state = _CONTENT if thinking is False else _START
        self._buf = ""
        self._reasoning = _BlankHeld("")
        self._content = _BlankHeld("\n")

    def feed(self, delta: str) -> tuple[str, str]:
        """Take the next piece of output; return ``(reasoning delta, content delta)``."""
        self._buf += delta
        return self._run(final=False)

    def finish(self) -> tuple[str, str]:
        """End of output: return what was held back, as ``(reasoning delta, content delta)``."""
        return self._run(final=True)

    def _run(self, final: bool) -> tuple[str, str]:
        reasoning, content = [], []
        while True:
            if self._state == _START:
                if self._buf.startswith(THINK_OPEN):
                    self._buf, self._state = self._buf[len(THINK_OPEN):], _REASONING
                elif THINK_OPEN.startswith(self._buf) and not final:
                    break
                else:
                    self._state = _REASONING if self._thinking else _CONTENT
            elif self._state == _REASONING:
                i = self._buf.find(THINK_CLOSE)
                if i >= 0:
                    reasoning.append(self._reasoning.push(self._buf[:i]))
                    self._buf, self._state = self._buf[i + len(THINK_CLOSE):], _CONTENT
                    continue
                keep = len(self._buf) - (0 if final else held_suffix(self._buf, THINK_CLOSE))
                reasoning.append(self._reasoning.push(self._buf[:keep]))
                self._buf = self._buf[keep:]
                break
            else:
                content.append(self._content.push(self._buf))
                self._buf = ""
                break
        return "".join(reasoning), "".join(content)


class Qwen3ReasoningParser:
    """Splits Qwen3 (and QwQ / DeepSeek-R1-style) ``<think>`` output into reasoning and content (module
    docstring: the rules)."""

    reasoning_start_str, reasoning_end_str = THINK_OPEN, THINK_CLOSE  # the markers (``--reasoning-config``)

    def extract(self, text: str, *, thinking: bool | None = None) -> tuple[str | None, str | None]:
        """``(reasoning, content)`` of a whole output; ``None`` for a blank part."""
        if thinking is False:
            return None, _part(text.lstrip("\n"))
        opened = text.startswith(THINK_OPEN)
        if opened:
            text = text[len(THINK_OPEN):]
        if not opened and not thinking:
            return None, _part(text.lstrip("\n"))
        reasoning, found, after = text.partition(THINK_CLOSE)
        if found:
            return _part(reasoning), _part(after.lstrip("\n"))
        return _part(text), None

    def count_tokens(self, token_ids: list[int], decode: Callable[[list[int]], str], *,
                     thinking: bool | None = None) -> int:
        """How many of an output's ``token_ids`` are reasoning (``usage.completion_tokens_details``): those
        between the think block's tags, the tags' own tokens left out, as vLLM counts them; all of them when the
        block is not closed. ``decode`` turns ids into text (special tokens kept); it is called on a few
        prefixes only (the end of the block is found by bisection)."""
        text = decode(token_ids)
        opened = thinking is not False and text.startswith(THINK_OPEN)
        if thinking is False or not (opened or thinking):
            return 0
        first = _first_prefix(token_ids, decode, lambda t: len(t) >= len(THINK_OPEN)) if opened else 0
        if THINK_CLOSE not in text:
            return len(token_ids) - first
        # the tokens that reach the start of ``</think>``: a tag of several tokens is left out whole
        close = text.index(THINK_CLOSE)
        end = _first_prefix(token_ids, decode, lambda t: len(t) >= close) if close else 0
        return max(0, end - first)

    def streamer(self, *, thinking: bool | None = None) -> Qwen3ReasoningStreamer:
        """A fresh incremental parser for one output (``thinking``: as for ``extract``)."""
        return Qwen3ReasoningStreamer(thinking)

    @staticmethod
    def thinking_from_prompt(prompt: str) -> bool | None:
        """What a rendered prompt decided: ``True`` if it ends inside an opened think block (``<think>\\n``),
        ``False`` if it ends after a closed one (``enable_thinking=False``), else ``None``."""
        tail = prompt.rstrip()
        if tail.endswith(THINK_CLOSE):
            return False
        return True if tail.endswith(THINK_OPEN) else None


def _first_prefix(token_ids: list[int], decode: Callable[[list[int]], str], holds: Callable[[str], bool]) -> int:
    """The smallest ``n`` whose ``decode(token_ids[:n])`` ``holds`` (a property that, once true, stays true as
    the prefix grows; it must hold for the whole output)."""
    lo, hi = 1, len(token_ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if holds(decode(token_ids[:mid])):
            hi = mid
        else:
            lo = mid + 1
    return lo


class GptOssReasoningStreamer:
    """One streamed gpt-oss output: its ``analysis`` bodies are reasoning, its answer the content (tool calls,
    which are neither, are the tool parser's)."""

    def __init__(self) -> None:
        self._harmony = HarmonyStreamer()

    def feed(self, delta: str) -> tuple[str, str]:
        """Take the next piece of output; return ``(reasoning delta, content delta)``."""
        out = self._harmony.feed(delta)
        return out.reasoning, out.content

    def finish(self) -> tuple[str, str]:
        """End of output: return what was held back, as ``(reasoning delta, content delta)``."""
        out = self._harmony.finish()
        return out.reasoning, out.content


class GptOssReasoningParser:
    """gpt-oss's reasoning: the ``analysis`` channel of its harmony messages (``tool_parsers/harmony.py``: the rules).

    ``thinking`` is accepted for the common interface and changes nothing: a harmony output names each message's
    channel itself. The markers (for ``thinking_token_budget``) are the analysis message's header and
    ``<|end|>``."""

    reasoning_start_str, reasoning_end_str = f"{CHANNEL}{ANALYSIS}{MESSAGE}", END

    def extract(self, text: str, *, thinking: bool | None = None) -> tuple[str | None, str | None]:
        """``(reasoning, content)`` of a whole output; ``None`` for an empty part."""
        message = parse_harmony(text)
        return message.reasoning, message.content

    def count_tokens(self, token_ids: list[int], decode: Callable[[list[int]], str], *,
                     thinking: bool | None = None) -> int:
        """How many of ``token_ids`` are in analysis bodies (``decode`` keeps special tokens)."""
        return count_reasoning_tokens(token_ids, lambda t: decode([t]))

    def streamer(self, *, thinking: bool | None = None) -> GptOssReasoningStreamer:
        """A fresh incremental parser for one output."""
        return GptOssReasoningStreamer()

    @staticmethod
    def thinking_from_prompt(prompt: str) -> bool | None:
        """Always ``None``: a harmony prompt leaves the channel to the model."""
        return None


#: ``--reasoning-parser`` names (vLLM's; ``gpt_oss`` too) to parser classes
REASONING_PARSERS = {"qwen3": Qwen3ReasoningParser, "openai_gptoss": GptOssReasoningParser,
                     "gpt_oss": GptOssReasoningParser}
#: the reasoning parsers of the harmony format: a server with one reads chat outputs as harmony
HARMONY_REASONING_PARSERS = ("openai_gptoss", "gpt_oss")


def with_reasoning_markers(engine_kwargs: dict, reasoning_parser: str | None) -> dict:
    """``engine_kwargs`` with ``reasoning_config`` (for ``thinking_token_budget``) taken from the reasoning
    parser's markers where the user did not give one, as vLLM derives it."""
    if reasoning_parser is None or engine_kwargs.get("reasoning_config") is not None:
        return engine_kwargs
    parser = REASONING_PARSERS[reasoning_parser]
    return {**engine_kwargs, "reasoning_config": {"reasoning_start_str": parser.reasoning_start_str,
                                                  "reasoning_end_str": parser.reasoning_end_str}}
