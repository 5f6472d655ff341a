"""The Qwen3 reasoning parser on recorded Qwen3 outputs: exact ``extract`` results, and the streaming
invariant: for any split of an output into deltas, the joined reasoning deltas equal ``extract``'s reasoning
and the joined content deltas its content (``None`` as ``""``; both sides apply the same rules: leading
newlines of content removed, a blank part is empty)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minivllm.entrypoints.openai.reasoning import REASONING_PARSERS, Qwen3ReasoningParser

THINK = ("Okay, the user is asking what 17 * 24 is. Let me compute: 17 * 20 = 340, 17 * 4 = 68, so "
         "340 + 68 = 408. Let me double-check: 24 * 17 = 24 * 10 + 24 * 7 = 240 + 168 = 408. Yes.")
CALL = '<tool_call>\n{"name": "get_current_weather", "arguments": {"location": "Paris"}}\n</tool_call>'
# (text, thinking, reasoning, content)
CASES = {
    "thinking": (f"<think>\n{THINK}\n</think>\n\n17 × 24 = **408**.", None, f"\n{THINK}\n",
                 "17 × 24 = **408**."),
    "no_think": ("<think>\n\n</think>\n\nHello! How can I help you today?", None, None,
                 "Hello! How can I help you today?"),
    "cut_off": ("<think>\nThe user wants the Fibonacci numbers. The first terms are 1, 1, 2, 3, 5", None,
                "\nThe user wants the Fibonacci numbers. The first terms are 1, 1, 2, 3, 5", None),
    "cut_in_tag": ("<think>\nAlmost done.\n</thi", None, "\nAlmost done.\n</thi", None),
    "thinking_off": ("Paris is the capital of France.", None, None, "Paris is the capital of France."),
    "open_tag_in_prompt": ("The user wants a haiku.\n</think>\n\nAutumn moonlight—", True,
                           "The user wants a haiku.\n", "Autumn moonlight—"),
    "untagged_is_content": ("The user wants a haiku.\n</think>\n\nAutumn", None, None,
                            "The user wants a haiku.\n</think>\n\nAutumn"),
    "then_tool_call": ("<think>\nI need the weather tool for Paris.\n</think>\n\n" + CALL, None,
                       "\nI need the weather tool for Paris.\n", CALL),
    "tags_in_reasoning": ("<think>\nThe <think> tag opens; </think>\n\n\n  Done.</think>x", None,
                          "\nThe <think> tag opens; ", "  Done.</think>x"),
    "blank_content": ("<think>\nhmm\n</think>\n\n \n", None, "\nhmm\n", None),
    "empty": ("", None, None, None),
    "only_open": ("<think>\n", None, None, None),
    "partial_open": ("<thi", None, None, "<thi"),
    "forced_on": ("Let me think about haiku.", True, "Let me think about haiku.", None),
    "forced_on_closed": ("<think>a</think>\nb", True, "a", "b"),
    "forced_off": ("\n<think>x</think>y", False, None, "<think>x</think>y"),
}


def stream(pieces, thinking=None) -> tuple[str, str]:
    s = Qwen3ReasoningParser().streamer(thinking=thinking)
    out = [s.feed(p) for p in pieces] + [s.finish()]
    return "".join(r for r, _ in out), "".join(c for _, c in out)


def agree(text: str, pieces, thinking=None) -> tuple[str, str]:
    assert "".join(pieces) == text
    reasoning, content = Qwen3ReasoningParser().extract(text, thinking=thinking)
    got = stream(pieces, thinking)
    assert got == (reasoning or "", content or "")
    return got


def splits(text: str, cuts) -> list[str]:
    """``text`` cut at ``cuts`` (taken modulo ``len(text) + 1``)."""
    cuts = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    return [text[a:b] for a, b in zip(cuts, cuts[1:])]


@pytest.mark.parametrize("key", CASES)
def test_extract(key):
    text, thinking, reasoning, content = CASES[key]
    assert REASONING_PARSERS["qwen3"]().extract(text, thinking=thinking) == (reasoning, content)


@pytest.mark.parametrize("key", CASES)
def test_stream_any_one_or_two_cuts(key):
    text, thinking, *_ = CASES[key]
    agree(text, list(text), thinking)
    for i in range(len(text) + 1):
        agree(text, [text[:i], text[i:]], thinking)
    for mark in ("<think>", "</think>", "\n\n"):  # every cut inside (and around) every tag
        cuts = [m.start() + k for m in re.finditer(re.escape(mark), text) for k in range(len(mark) + 1)]
        agree(text, splits(text, cuts), thinking)


@settings(max_examples=50, deadline=None)
@given(st.sampled_from(sorted(CASES)), st.lists(st.integers(0, 400), max_size=12))
def test_stream_random_splits(key, cuts):
    text, thinking, *_ = CASES[key]
    agree(text, splits(text, cuts), thinking)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(["<think>", "</think>", "<thi", "nk>", "</", "\n", " ", "a", "é", "<"]),
                max_size=12),
       st.lists(st.integers(0, 100), max_size=6), st.sampled_from([None, True, False]))
def test_any_output_agrees(fragments, cuts, thinking):
    text = "".join(fragments)
    agree(text, splits(text, cuts), thinking)


def test_stream_passes_text_on_at_once():
    s = Qwen3ReasoningParser().streamer()
    assert s.feed("<thi") == ("", "")
    assert s.feed("nk>\n") == ("", "")  # a blank reasoning so far is held (it may stay blank)
    assert s.feed("Okay, 2 + 2") == ("\nOkay, 2 + 2", "")
    assert s.feed(" = 4.\n</th") == (" = 4.\n", "")  # only the partial </think> is held
    assert s.feed("ink>\n\n") == ("", "")
    assert s.feed("The answer") == ("", "The answer")
    assert s.feed(" is 4.") == ("", " is 4.")
    assert s.finish() == ("", "")


def test_untagged_output_streams_as_content_at_once():
    text = "Paris is the capital of France."
    s = Qwen3ReasoningParser().streamer()
    assert s.feed(text) == ("", text) and s.finish() == ("", "")
    assert Qwen3ReasoningParser().streamer(thinking=False).feed(text) == ("", text)
    assert Qwen3ReasoningParser().streamer(thinking=True).feed(text) == (text, "")


def test_thinking_from_prompt():
    p = Qwen3ReasoningParser.thinking_from_prompt
    assert p("<|im_start|>assistant\n<think>\n\n</think>\n\n") is False
    assert p("<|im_start|>assistant\n<think>\n") is True
    assert p("<|im_start|>assistant\n") is None


@pytest.mark.parametrize("pieces, thinking, n", [
    (["<think>", "a", "b", "</think>", "x"], None, 2),
    (["<think>", "a", "b", "</", "think", ">", "x"], None, 2),  # a tag of several tokens is left out whole
    (["a", "b", "c", "</", "think>", "\n\n", "{}"], True, 3),
    (["</", "think>", "{}"], True, 0),
    (["a", "b"], True, 2),  # not closed: all reasoning
    (["<think>", "a", "</think>"], False, 0),
    (["x", "y"], None, 0),
])
def test_reasoning_tokens_are_those_between_the_tags(pieces, thinking, n):
    ids = list(range(len(pieces)))
    decode = lambda token_ids: "".join(pieces[i] for i in token_ids)  # noqa: E731
    assert Qwen3ReasoningParser().count_tokens(ids, decode, thinking=thinking) == n
