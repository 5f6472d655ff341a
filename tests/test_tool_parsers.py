"""Tool-call parsers on recorded Qwen2.5 / Qwen3 (Hermes) and Llama 3.1 outputs: exact ``extract`` results,
and the streaming invariant for any split of an output into deltas.

The invariant (``agree``): the joined streamed content equals ``extract``'s content (``None`` as ``""``:
both are stripped); the streamed calls whose joined argument fragments parse as a JSON object are, in order,
``extract``'s calls (same names, ``json.loads``-equal arguments); the others are calls the stream had
committed to (name sent) that were then cut off or had invalid arguments, which ``extract`` drops. The
first delta of each call carries its id and name, later ones neither; indices count up from 0.
"""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minivllm.entrypoints.openai.tool_parsers import TOOL_PARSERS, HermesToolParser, Llama3JsonToolParser
from minivllm.entrypoints.openai.tool_parsers.json_scan import JsonScanner

ID = re.compile(r"call_[0-9a-f]{24}")
SF = "San Francisco, CA, USA"
WEATHER = {"location": "San Francisco, CA", "unit": "fahrenheit"}
CODE = {"code": 'def f(d):\n    return {"a": d["b"]}  # }\nprint(f({"b": 1}))',
        "options": {"timeout": 10, "env": {"PATH": "C:\\bin"}, "flags": ["-u", "{", "}"]}}
W = '<tool_call>\n{"name": "get_current_weather", "arguments": ' + json.dumps(WEATHER) + "}\n</tool_call>"
BAD = '<tool_call>\n{"name": "get_time", "arguments": "UTC"}\n</tool_call>'
SAME = "the whole text, stripped"

# name: (text, content, [(name, arguments)], number of calls a stream starts)
HERMES = {
    "one": (W, None, [("get_current_weather", WEATHER)], 1),
    "parallel": (
        f'<tool_call>\n{{"name": "get_current_temperature", "arguments": {{"location": "{SF}"}}}}'
        "\n</tool_call>\n"
        f'<tool_call>\n{{"name": "get_temperature_date", "arguments": {{"location": "{SF}", "date": '
        '"2024-10-01"}}\n</tool_call>', None,
        [("get_current_temperature", {"location": SF}),
         ("get_temperature_date", {"location": SF, "date": "2024-10-01"})], 2),
    "content_first": ("I'll look up the current weather in San Francisco for you.\n\n" + W,
                      "I'll look up the current weather in San Francisco for you.",
                      [("get_current_weather", WEATHER)], 1),
    "nested": ('<tool_call>\n{"name": "run_python", "arguments": ' + json.dumps(CODE) + "}\n</tool_call>",
               None, [("run_python", CODE)], 1),
    "unicode": ('<tool_call>\n{"name": "translate", "arguments": {"text": "Ça va? 你好 👋", '
                '"to": "\\u65e5\\u672c"}}\n</tool_call>', None,
                [("translate", {"text": "Ça va? 你好 👋", "to": "日本"})], 1),
    "tags_in_string": ('<tool_call>\n{"name": "echo", "arguments": {"text": "use </tool_call> or '
                       '<tool_call>"}}\n</tool_call>', None,
                       [("echo", {"text": "use </tool_call> or <tool_call>"})], 1),
    "parameters_no_close": ('<tool_call>\n{"name": "get_time", "parameters": {"timezone": "UTC"}}', None,
                            [("get_time", {"timezone": "UTC"})], 1),
    "keys_reversed_no_args": ('<tool_call>\n{"arguments": {"n": 2}, "name": "roll"}\n</tool_call>\n'
                              '<tool_call>\n{"name": "now"}\n</tool_call>', None,
                              [("roll", {"n": 2}), ("now", {})], 2),
    "no_close_between": ('<tool_call>\n{"name": "a", "arguments": {}}\n<tool_call>\n{"name": "b", '
                         '"arguments": {"x": [1, 2]}}\n</tool_call>\nDone.', "Done.",
                         [("a", {}), ("b", {"x": [1, 2]})], 2),
    "cut_off": ('Checking.\n<tool_call>\n{"name": "get_current_weather", "arguments": {"location": "San Fra',
                "Checking.", [], 1),
    "cut_before_args": ('<tool_call>\n{"name": "get_current_weather", "argu', SAME, [], 0),
    "not_json": ("<tool_call>\n{not json}\n</tool_call>", SAME, [], 0),
    "no_name": ('<tool_call>\n{"arguments": {"city": "Paris"}}\n</tool_call>', SAME, [], 0),
    "args_not_object": (BAD, SAME, [], 0),
    "bad_between_good": (W + "\n" + BAD + "\n" + W, BAD, [("get_current_weather", WEATHER)] * 2, 2),
    "invalid_args_json": ('<tool_call>\n{"name": "f", "arguments": {"a": tru}}\n</tool_call>\n' + W, None,
                          [("get_current_weather", WEATHER)], 2),
    "plain": ("The weather in Paris is 18°C and sunny. Use a <tool> tag, or <tool_call without >.", SAME,
              [], 0),
}
L_W = '{"name": "get_current_weather", "parameters": ' + json.dumps(WEATHER) + "}"
LLAMA = {
    "tag": ("<|python_tag|>" + L_W, None, [("get_current_weather", WEATHER)], 1),
    "plain_json": ("  " + L_W, None, [("get_current_weather", WEATHER)], 1),
    "several": ('{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "arguments": '
                '{"timezone": "Europe/Paris"}}', None,
                [("get_weather", {"city": "Paris"}), ("get_time", {"timezone": "Europe/Paris"})], 2),
    "nested_then_text": ('<|python_tag|> {"name": "run_python", "parameters": ' + json.dumps(CODE) +
                         "}\n\nRunning it.", "Running it.", [("run_python", CODE)], 1),
    "text": ("The current weather in San Francisco is 72 degrees Fahrenheit and sunny.", SAME, [], 0),
    "python_code": ("<|python_tag|>import math\nprint(math.sqrt(2))", SAME, [], 0),
    "json_answer": ('{"city": "Paris", "population": 2102650}', SAME, [], 0),
    "cut_off": ('{"name": "get_weather", "parameters": {"city": "Par', None, [], 1),
    "broken_object": ('{"name": "f" <eom>', SAME, [], 0),
}
CASES = [(cls, k, t, t.strip() if c is SAME else c, calls, n) for cls, table in
         ((HermesToolParser, HERMES), (Llama3JsonToolParser, LLAMA)) for k, (t, c, calls, n) in table.items()]
IDS = [f"{p.__name__[:6]}-{k}" for p, k, *_ in CASES]


def obj(text: str):
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def stream(parser, pieces) -> tuple[str, list[list[str]]]:
    """Feed ``pieces``, check the deltas' shape, and return the joined content and ``[id, name, args]``."""
    s = parser.streamer()
    content, calls = [], []
    for piece in [*pieces, None]:
        text, deltas = s.finish() if piece is None else s.feed(piece)
        content.append(text)
        for d in deltas:
            if d.index == len(calls):
                assert ID.fullmatch(d.id) and d.name
                calls.append([d.id, d.name, d.arguments])
            else:
                assert d.index == len(calls) - 1 and d.id is None and d.name is None and d.arguments
                calls[-1][2] += d.arguments
        assert s.num_calls == len(calls)
    assert len({c[0] for c in calls}) == len(calls)
    return "".join(content), calls


def agree(parser, text: str, pieces) -> tuple[str, list[list[str]]]:
    """Check the streaming invariant (module docstring) for one split of ``text``."""
    assert "".join(pieces) == text
    content, calls = stream(parser, pieces)
    want_content, want_calls = parser.extract(text)
    assert content == (want_content or "")
    assert [(n, obj(a)) for _, n, a in calls if obj(a) is not None] == \
        [(c.name, json.loads(c.arguments)) for c in want_calls]
    return content, calls


def splits(text: str, cuts) -> list[str]:
    """``text`` cut at ``cuts`` (taken modulo ``len(text) + 1``)."""
    cuts = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    return [text[a:b] for a, b in zip(cuts, cuts[1:])]


@pytest.mark.parametrize("cls,key,text,content,calls,started", CASES, ids=IDS)
def test_extract(cls, key, text, content, calls, started):
    got_content, got_calls = cls().extract(text)
    assert got_content == content
    assert [(c.name, json.loads(c.arguments)) for c in got_calls] == calls
    for c in got_calls:
        assert ID.fullmatch(c.id) and c.arguments == json.dumps(json.loads(c.arguments), ensure_ascii=False)


@pytest.mark.parametrize("cls,key,text,content,calls,started", CASES, ids=IDS)
def test_stream_one_char_and_two_pieces(cls, key, text, content, calls, started):
    got, streamed = agree(cls(), text, list(text))
    assert got == (content or "") and len(streamed) == started
    for _, _, args in streamed:  # raw characters of the arguments object, nothing after it (or re-serialized)
        assert obj(args) is None or args in text or args == json.dumps(obj(args), ensure_ascii=False)
    names = [n for _, n, _ in streamed]
    for i in range(len(text) + 1):
        assert [n for _, n, _ in agree(cls(), text, [text[:i], text[i:]])[1]] == names


@pytest.mark.parametrize("cls,key,text,content,calls,started", CASES, ids=IDS)
def test_stream_awkward_boundaries(cls, key, text, content, calls, started):
    marks = ["<tool", "<tool_call", "_call>", "</tool", '"na', '"name": "', '"name": "get_', '"arguments": ',
             '"parameters": ', '{"', "\\", '\\"', "}", "<|python", "; ", "Fra"]
    for mark in marks:
        agree(cls(), text, splits(text, [m.start() + k for m in re.finditer(re.escape(mark), text)
                                         for k in range(len(mark) + 1)]))


@settings(max_examples=50, deadline=None)
@given(st.sampled_from(CASES), st.lists(st.integers(0, 400), max_size=12))
def test_stream_random_splits(case, cuts):
    cls, _, text, *_ = case
    agree(cls(), text, splits(text, cuts))


FRAGMENTS = ["<tool_call>", "</tool_call>", "<tool", "_call>", "\n", " ", "{", "}", "[", "]", '"name"', ":",
             ",", '"arguments"', '"parameters"', '"f"', '"g\\"h"', '"a"', "1", "tru", "e", "\\", '"', "x",
             "é", "; ", "}}", "<|python_tag|>", '{"name": "f", "arguments": {',
             '{"name": "g", "parameters": {"k": [1, {"v": "}"}]}}',
             '<tool_call>\n{"name": "f", "arguments": {"a": "b\\"}"}}\n</tool_call>']
STARTS = ["", " ", "<tool_call>", '{"name": "f", "parameters": {', '<|python_tag|> {"name": "f", ']


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(STARTS),
       st.lists(st.sampled_from(FRAGMENTS), max_size=16), st.lists(st.integers(0, 300), max_size=8),
       st.sampled_from(sorted(TOOL_PARSERS)))
def test_any_output_agrees(start, fragments, cuts, name):
    """Not only recorded outputs: any text (valid, malformed, cut off) streams as ``extract`` says."""
    text = start + "".join(fragments)
    agree(TOOL_PARSERS[name](), text, splits(text, cuts))


LEAF = st.none() | st.booleans() | st.integers() | st.text() | st.sampled_from(["</tool_call>", '}{"\\'])
JSON = st.recursive(LEAF,
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
                    max_leaves=8)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.from_regex(r"[A-Za-z_][\w.-]{0,20}", fullmatch=True),
                          st.dictionaries(st.text(max_size=8), JSON, max_size=4), st.booleans()),
                min_size=1, max_size=3),
       st.sampled_from(["", "Let me call the tools.\n\n"]), st.lists(st.integers(0, 2000), max_size=10))
def test_generated_calls_round_trip(calls, prefix, cuts):
    """Any names and arguments (escapes, unicode, tags and braces in strings), both formats, any split."""
    raw = [(name, json.dumps(args, ensure_ascii=ascii)) for name, args, ascii in calls]
    hermes = prefix + "".join(f'<tool_call>\n{{"name": "{n}", "arguments": {a}}}\n</tool_call>'
                              for n, a in raw)
    llama = "; ".join(f'{{"name": "{n}", "parameters": {a}}}' for n, a in raw)
    for parser, text, content in ((HermesToolParser(), hermes, prefix.strip() or None),
                                  (Llama3JsonToolParser(), llama, None)):
        got_content, got = parser.extract(text)
        assert got_content == content and [(c.name, json.loads(c.arguments)) for c in got] == [
            (name, args) for name, args, _ in calls]
        streamed = agree(parser, text, splits(text, cuts))[1]
        assert [(n, a) for _, n, a in streamed] == raw  # the raw argument text, exactly


def test_hermes_stream_emits_early_and_holds_only_partial_tags():
    s = HermesToolParser().streamer()
    assert s.feed("Sure, checking the weather <tool") == ("Sure, checking the weather", [])
    assert s.feed("_call>\n{\"name\": \"get_current_weather\"") == ("", [])
    assert s.feed(', "arguments": ') == ("", [])
    text, deltas = s.feed('{"location": "San')
    assert text == "" and len(deltas) == 1 and deltas[0].name == "get_current_weather"
    assert deltas[0].index == 0 and ID.fullmatch(deltas[0].id) and deltas[0].arguments == '{"location": "San'
    text, deltas = s.feed(' Francisco\\"}"}}\n</tool_call>\nAnything else?')
    assert text == " \nAnything else?" and [(d.index, d.id, d.arguments) for d in deltas] == [
        (0, None, ' Francisco\\"}"}')]
    assert s.finish() == ("", []) and s.num_calls == 1


def test_llama_stream_decides_at_first_character():
    s = Llama3JsonToolParser().streamer()
    assert s.feed("  <|python") == ("", [])
    assert s.feed("_tag|>") == ("", [])
    assert s.feed('{"name": "get_weather", "parameters": {"city"')[1][0].arguments == '{"city"'
    assert s.feed(': "Paris"}} ; {"name": "f", "parameters": {}}')[1][1].name == "f"
    s = Llama3JsonToolParser().streamer()
    assert s.feed("\nThe") == ("The", []) and s.feed(" answer {") == (" answer {", [])


def test_json_scanner_pieces():
    text = r'{"a": "x}\"]", "b": [1, {"c": null}]} tail'
    for i in range(len(text)):
        s = JsonScanner()
        n = s.feed(text[:i])
        n += s.feed(text[i:])
        assert s.done and n == text.index(" tail")
    for bad in ('{"a": 1]', "{<", '{"a": NaN}', "x"):
        s = JsonScanner()
        assert s.feed(bad) < len(bad) and s.broken and not s.done
