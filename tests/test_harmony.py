"""gpt-oss's harmony format read back (``tool_parsers/harmony.py``, the ``openai_gptoss`` reasoning parser, the
``openai`` tool parser, the chat reader) on hand-written outputs, whole and streamed at every split; the forced
call's grammar in llguidance; the tiny harmony checkpoint's chat template."""

from __future__ import annotations

import json

import pytest

from minivllm.entrypoints.openai.harmony_outputs import HarmonyOutputReader
from minivllm.entrypoints.openai.protocol import FunctionDefinition, NamedFunction, NamedToolChoice, Tool
from minivllm.entrypoints.openai.reasoning import REASONING_PARSERS, GptOssReasoningParser
from minivllm.entrypoints.openai.structured import constraint, harmony_call_grammar
from minivllm.entrypoints.openai.tool_parsers import TOOL_PARSERS, OpenAIToolParser
from minivllm.entrypoints.openai.tool_parsers.harmony import (
    MAX_HEADER_CHARS,
    HarmonyStreamer,
    count_reasoning_tokens,
    parse_harmony,
)
from tests.helpers.harmony_checkpoints import build_harmony_tokenizer

CALL = ('<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
        '{"city": "Paris", "unit": "celsius"}<|call|>')
THINK_THEN_FINAL = ("<|channel|>analysis<|message|>The user greets; answer <politely>.<|end|>"
                    "<|start|>assistant<|channel|>final<|message|>Hello, <b>world</b>!")
THINK_THEN_CALL = ("<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant"
                   "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant" + CALL)
#: hand-written outputs -> (reasoning, content, [(name, arguments)])
CASES = {
    "reasoning then final": (THINK_THEN_FINAL, "The user greets; answer <politely>.", "Hello, <b>world</b>!", []),
    "reasoning then a call": (THINK_THEN_CALL, "Need the weather.", "Checking.",
                              [("get_weather", '{"city": "Paris", "unit": "celsius"}')]),
    "recipient before the channel": ("<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{}<|call|>",
                                     None, None, [("f", "{}")]),
    "two calls": (CALL + "<|start|>assistant<|channel|>commentary to=functions.t <|constrain|>json<|message|>"
                  '{"a": [1, 2]}<|call|>', None, None,
                  [("get_weather", '{"city": "Paris", "unit": "celsius"}'), ("t", '{"a": [1, 2]}')]),
    "a call cut short": ('<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"ci',
                         None, None, [("get_weather", '{"ci')]),
    "a header cut short": ("<|channel|>analysis<|message|>hm<|end|><|start|>assist", "hm", None, []),
    "a built-in tool's call is ignored": ("<|channel|>analysis to=browser.search<|message|>{}<|call|>", None, None, []),
    "final without <|end|> before <|start|>": ("<|channel|>final<|message|>a<|start|>assistant<|channel|>final"
                                               "<|message|> b<|return|>", None, "a b", []),
    "no harmony at all": ("x" * (MAX_HEADER_CHARS + 20) + "<|message|>y", None,
                          "x" * (MAX_HEADER_CHARS + 20) + "<|message|>y", []),
    "empty": ("", None, None, []),
}


def _expected(case):
    _, reasoning, content, calls = CASES[case]
    return reasoning, content, calls


def _stream(pieces: list[str]):
    """(reasoning, content, [(name, arguments)]) of a stream of ``pieces``, checking each call's id comes once."""
    s = HarmonyStreamer()
    reasoning, content, calls = "", "", []
    for out in [s.feed(p) for p in pieces] + [s.finish()]:
        reasoning += out.reasoning
        content += out.content
        for d in out.calls:
            if d.id is not None:
                assert d.index == len(calls) and d.name, d
                calls.append([d.name, ""])
            else:
                assert d.name is None
            calls[d.index][1] += d.arguments
    assert s.num_calls == len(calls)
    return reasoning or None, content or None, [tuple(c) for c in calls]


@pytest.mark.parametrize("case", CASES)
def test_a_whole_output(case):
    text = CASES[case][0]
    message = parse_harmony(text)
    assert (message.reasoning, message.content, [(c.name, c.arguments) for c in message.calls]) == _expected(case)
    assert all(c.id.startswith("call_") for c in message.calls)


@pytest.mark.parametrize("case", CASES)
def test_a_stream_split_anywhere_gives_the_whole_outputs_parts(case):
    """At every split point into two pieces, and one character at a time: no text is lost or sent twice."""
    text = CASES[case][0]
    want = _expected(case)
    for i in range(len(text) + 1):
        assert _stream([text[:i], text[i:]]) == want, i
    assert _stream(list(text)) == want


@pytest.fixture(scope="module")
def harmony_tokenizer(tmp_path_factory):
    return build_harmony_tokenizer(tmp_path_factory.mktemp("harmony-tok"))


@pytest.mark.parametrize("case", ["reasoning then final", "reasoning then a call", "two calls"])
def test_a_stream_of_the_tokenizers_tokens(case, harmony_tokenizer):
    """Split at the harmony tokenizer's token boundaries (special tokens whole), as the server streams it; the
    reasoning tokens are the analysis bodies' tokens."""
    text = CASES[case][0]
    ids = harmony_tokenizer.encode(text, add_special_tokens=False)
    pieces = [harmony_tokenizer.decode([t], skip_special_tokens=False) for t in ids]
    assert "".join(pieces) == text
    assert _stream(pieces) == _expected(case)
    reasoning = _expected(case)[0]
    n = count_reasoning_tokens(ids, lambda t: harmony_tokenizer.decode([t], skip_special_tokens=False))
    assert n == (len(harmony_tokenizer.encode(reasoning, add_special_tokens=False)) if reasoning else 0)


def test_the_reasoning_and_tool_parsers_by_their_vllm_names():
    assert REASONING_PARSERS["openai_gptoss"] is REASONING_PARSERS["gpt_oss"] is GptOssReasoningParser
    assert TOOL_PARSERS["openai"] is OpenAIToolParser
    reasoning = GptOssReasoningParser()
    assert reasoning.extract(THINK_THEN_FINAL) == ("The user greets; answer <politely>.", "Hello, <b>world</b>!")
    assert reasoning.thinking_from_prompt("<|start|>assistant") is None
    st = reasoning.streamer()
    parts = [st.feed(c) for c in THINK_THEN_CALL] + [st.finish()]
    assert ("".join(r for r, _ in parts), "".join(c for _, c in parts)) == ("Need the weather.", "Checking.")
    tools = OpenAIToolParser()
    content, calls = tools.extract(THINK_THEN_CALL)
    assert content == "Checking." and [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris", "unit": "celsius"})]
    ts = tools.streamer()
    pieces = [ts.feed(THINK_THEN_CALL[:60]), ts.feed(THINK_THEN_CALL[60:]), ts.finish()]
    assert "".join(c for c, _ in pieces) == "Checking." and ts.num_calls == 1
    assert "".join(d.arguments for _, ds in pieces for d in ds) == '{"city": "Paris", "unit": "celsius"}'


def test_the_chat_reader_reports_what_the_request_and_server_asked():
    """Calls only with a tool choice other than none; reasoning only with the reasoning parser and
    ``include_reasoning``; streamed deltas agree with the whole message."""
    both = HarmonyOutputReader("auto", reasoning=True).message(THINK_THEN_CALL)
    assert both.reasoning == "Need the weather." and both.content == "Checking."
    assert [c.function.name for c in both.tool_calls] == ["get_weather"]
    assert HarmonyOutputReader("none", reasoning=True).message(THINK_THEN_CALL).tool_calls == []
    assert HarmonyOutputReader("auto", reasoning=True, include_reasoning=False).message(THINK_THEN_CALL).reasoning is None
    assert HarmonyOutputReader("auto", reasoning=False).message(THINK_THEN_CALL).reasoning is None
    st = HarmonyOutputReader("required", reasoning=True).streamer()
    deltas = [d for d in [st.feed(c) for c in THINK_THEN_CALL] + [st.finish()] if d is not None]
    assert "".join(d.reasoning or "" for d in deltas) == "Need the weather."
    assert "".join(d.content or "" for d in deltas) == "Checking." and st.num_calls == 1
    calls = [c for d in deltas for c in d.tool_calls or []]
    assert calls[0].id and calls[0].function.name == "get_weather" and calls[0].type == "function"
    assert "".join(c.function.arguments for c in calls) == '{"city": "Paris", "unit": "celsius"}'


WEATHER = Tool(function=FunctionDefinition(name="get_weather", description="The weather in a city", parameters={
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                     "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}))
NOTE = Tool(function=FunctionDefinition(name="note"))


def _accepts(tokenizer, grammar: str, text: str) -> bool:
    import llguidance
    import llguidance.hf

    ll = llguidance.hf.from_tokenizer(tokenizer, n_vocab=len(tokenizer))
    matcher = llguidance.LLMatcher(ll, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    ids = tokenizer.encode(text, add_special_tokens=False)
    return all(matcher.consume_token(t) for t in ids) and matcher.is_stopped()


def test_a_forced_call_is_a_grammar_of_one_harmony_call(harmony_tokenizer):
    """``required`` allows a call of any tool, a named choice only that one; the arguments follow the schema (no
    whitespace between JSON tokens) and ``<|call|>`` ends the output."""
    required = harmony_call_grammar([WEATHER, NOTE], None)
    named = harmony_call_grammar([WEATHER, NOTE], "get_weather")
    ok = CALL.replace('", "', '","').replace('": "', '":"')
    note = "<|channel|>commentary to=functions.note <|constrain|>json<|message|>{}<|call|>"
    assert _accepts(harmony_tokenizer, required, ok) and _accepts(harmony_tokenizer, required, note)
    assert _accepts(harmony_tokenizer, named, ok) and not _accepts(harmony_tokenizer, named, note)
    assert not _accepts(harmony_tokenizer, named, ok.replace("celsius", "kelvin"))
    assert not _accepts(harmony_tokenizer, named, ok.replace("<|call|>", "<|end|>"))
    so, field = constraint(None, None, [WEATHER, NOTE], NamedToolChoice(function=NamedFunction(name="note")),
                           harmony=True)
    assert field == "tool_choice" and so.grammar == harmony_call_grammar([WEATHER, NOTE], "note")
    so, _ = constraint(None, None, [WEATHER], "auto", harmony=True)
    assert so is None


def test_the_chat_template_renders_tools_calls_and_results(harmony_tokenizer):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "reasoning": "Need the weather.", "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                                  "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "20C"},
            {"role": "assistant", "content": "It is 20C."}, {"role": "user", "content": "Thanks"}]
    text = harmony_tokenizer.apply_chat_template(msgs, tools=[WEATHER.model_dump(exclude_none=True)],
                                                 tokenize=False, add_generation_prompt=True)
    for part in ("<|start|>developer<|message|># Instructions\n\nBe brief.\n\n# Tools\n\n## functions\n\n"
                 "namespace functions {\n// The weather in a city\ntype get_weather = (_: {\ncity: string,\n"
                 'unit: "celsius" | "fahrenheit",\n}) => any;\n\n} // namespace functions<|end|>',
                 "<|start|>user<|message|>Weather in Paris?<|end|>",
                 "<|start|>assistant<|channel|>analysis<|message|>Need the weather.<|end|>",
                 '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
                 '{"city": "Paris"}<|call|>',
                 "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>20C<|end|>",
                 "<|start|>assistant<|channel|>final<|message|>It is 20C.<|end|>"):
        assert part in text, (part, text)
    assert text.startswith("<|start|>system<|message|>") and text.endswith("Thanks<|end|><|start|>assistant")
    with pytest.raises(Exception, match="must follow the call"):
        harmony_tokenizer.apply_chat_template([{"role": "tool", "tool_call_id": "x", "content": "1"}], tokenize=False)
