"""The shipped chat model (models/minivllm-demo-chat) follows Qwen3's chat protocol: through minivllm's ``LLM``,
greedy replies to prompts outside its training lists think (or not), call a tool or answer small arithmetic, and
minivllm's own qwen3 reasoning parser and hermes tool parser read them; its tokenizer has Qwen3's markers as
single tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from minivllm import LLM, SamplingParams
from minivllm.entrypoints.openai.reasoning import Qwen3ReasoningParser
from minivllm.entrypoints.openai.tool_parsers.hermes import HermesToolParser

CHAT = Path(__file__).resolve().parents[1] / "models" / "minivllm-demo-chat"
MARKERS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")
GREEDY = SamplingParams(temperature=0, max_tokens=120)
# NOTE: tool names built as the fine-tune's are (a verb and a noun of its lists), with a city and a ticker that
# it never saw. With verbs it never saw in a name, the model often misspells the name: scripts/eval_demo_chat.py
# measures that, and the model's README reports it.
TOOLS = [{"type": "function", "function": {
    "name": "fetch_local_weather", "description": "Current weather conditions in a location",
    "parameters": {"type": "object", "properties": {
        "place": {"type": "string", "description": "The city"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["place"]}}},
    {"type": "function", "function": {
        "name": "check_share_price", "description": "Current share price of a company",
        "parameters": {"type": "object", "properties": {"ticker": {"type": "string"}}, "required": ["ticker"]}}}]


@pytest.fixture(scope="module")
def llm():
    with LLM(str(CHAT), device="cpu", max_model_len=1024, num_kvcache_blocks=80) as engine:
        yield engine


def reply(llm, content: str, thinking: bool, tools=None) -> tuple[dict, str | None, str | None]:
    """The greedy output and its (reasoning, content) as the qwen3 parser splits them."""
    out = llm.chat([{"role": "user", "content": content}], GREEDY, use_tqdm=False, tools=tools,
                   chat_template_kwargs={"enable_thinking": thinking})[0]
    reasoning, text = Qwen3ReasoningParser().extract(out["text"], thinking=None if thinking else False)
    return out, reasoning, text


def test_tokenizer_maps_each_marker_to_one_id(llm):
    tok = llm.get_tokenizer()
    for i, marker in enumerate(MARKERS):
        assert tok.encode(marker, add_special_tokens=False) == [4000 + i]
        assert tok.decode([4000 + i], skip_special_tokens=True) == marker  # not special: text parsers see it
    rendered = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                       add_generation_prompt=True, enable_thinking=False)
    assert rendered.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_arithmetic_with_thinking_on_and_off(llm):
    """The protocol holds (a short think block, then a number, then the end); the sums are mostly wrong at this
    size, so the greedy replies are pinned as they are."""
    out, reasoning, content = reply(llm, "What is 4 + 3?", thinking=True)
    assert out["text"].startswith("<think>\n") and out["finish_reason"] == "stop"
    assert reasoning.strip() == "4 plus 3 is 11." and content == "11", out["text"]
    out, reasoning, content = reply(llm, "What is 4 + 3?", thinking=False)
    assert "<think>" not in out["text"] and reasoning is None and out["finish_reason"] == "stop"
    assert content == "13" and len(out["token_ids"]) < 10, out["text"]


def test_short_question_gets_a_short_answer(llm):
    out, reasoning, content = reply(llm, "Repeat after me: green tree", thinking=True)
    assert reasoning and content == "green tree" and out["finish_reason"] == "stop", out["text"]
    assert len(out["token_ids"]) < 50


@pytest.mark.parametrize("thinking", [True, False])
def test_tool_call_copies_the_tool_name_and_parses(llm, thinking):
    out, reasoning, content = reply(llm, "What is the weather in Zagreb?", thinking, TOOLS)
    assert (reasoning is not None) == thinking and out["finish_reason"] == "stop"
    rest, calls = HermesToolParser().extract(content)
    assert rest is None and len(calls) == 1, out["text"]
    assert calls[0].name == "fetch_local_weather"
    assert json.loads(calls[0].arguments) == {"place": "Zagreb"}, out["text"]
