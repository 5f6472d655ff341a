"""Offline ``LLM.chat``, as vLLM's: conversations through the chat template, then ``generate``."""

from __future__ import annotations

import pytest

from minivllm import LLM, SamplingParams

MSGS = [{"role": "user", "content": "def add(a, b):"}, {"role": "assistant", "content": "    return a"}]


@pytest.fixture(scope="module")
def llm(tiny_tied_model):
    return LLM(tiny_tied_model, device="cpu", max_model_len=128)


def test_chat_is_generate_on_the_rendered_conversation(llm):
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    text = llm.get_tokenizer().apply_chat_template(MSGS[:1], tokenize=False, add_generation_prompt=True)
    want = llm.generate([llm.get_tokenizer().encode(text, add_special_tokens=False)], params, use_tqdm=False)
    one = llm.chat(MSGS[:1], params, use_tqdm=False)
    two = llm.chat([MSGS[:1], MSGS], params, use_tqdm=False, add_generation_prompt=False, continue_final_message=False)
    assert one[0]["token_ids"] == want[0]["token_ids"] and len(two) == 2


def test_continue_final_message_and_template_kwargs(llm):
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    cont = llm.chat(MSGS, params, use_tqdm=False, add_generation_prompt=False, continue_final_message=True)
    rendered = llm.get_tokenizer().apply_chat_template(MSGS, tokenize=False, continue_final_message=True)
    assert rendered.endswith("    return a")
    want = llm.generate([llm.get_tokenizer().encode(rendered, add_special_tokens=False)], params, use_tqdm=False)
    assert cont[0]["token_ids"] == want[0]["token_ids"]
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if shout %}!{% endif %}"
    loud = llm.chat(MSGS[:1], params, use_tqdm=False, chat_template=template, chat_template_kwargs={"shout": True})
    want = llm.generate(["def add(a, b):!"], params, use_tqdm=False)
    assert loud[0]["token_ids"] == want[0]["token_ids"]
    with pytest.raises(ValueError, match="continue_final_message cannot be combined"):
        llm.chat(MSGS, params, continue_final_message=True)
    with pytest.raises(ValueError, match="continue_final_message needs the last message to be the assistant's"):
        llm.chat(MSGS[:1], params, add_generation_prompt=False, continue_final_message=True)
    with pytest.raises(ValueError, match="chat_template_kwargs may not set"):
        llm.chat(MSGS[:1], params, chat_template_kwargs={"tokenize": True})


@pytest.mark.parametrize("messages", [None, "hi", [], [[]], [{"role": "user", "content": "x"}, "y"], 3])
def test_bad_messages_name_the_parameter(llm, messages):
    if messages == []:  # no conversations: no outputs, as generate([])
        assert llm.chat(messages, use_tqdm=False) == []
        return
    with pytest.raises(ValueError, match="^messages must be a conversation"):
        llm.chat(messages, use_tqdm=False)


TOOLS = [{"type": "function", "function": {"name": "lookup_word", "description": "Look a word up.",
                                            "parameters": {"type": "object", "properties": {"word": {"type": "string"}},
                                                           "required": ["word"]}}}]


def test_tools_are_rendered_by_the_template(llm):
    """``tools`` reach the template (vLLM's ``LLM.chat(tools=...)``); bad ones are a ValueError naming tools."""
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    template = "{% for t in tools or [] %}[{{ t['function']['name'] }}]{% endfor %}{{ messages[0]['content'] }}"
    got = llm.chat(MSGS[:1], params, use_tqdm=False, chat_template=template, tools=TOOLS)
    want = llm.generate(["[lookup_word]def add(a, b):"], params, use_tqdm=False)
    assert got[0]["token_ids"] == want[0]["token_ids"]
    plain = llm.chat(MSGS[:1], params, use_tqdm=False, chat_template=template)
    assert plain[0]["token_ids"] == llm.generate(["def add(a, b):"], params, use_tqdm=False)[0]["token_ids"]
    for bad in ("lookup_word", [["x"]], {"name": "x"}):
        with pytest.raises(ValueError, match="^tools must be a list"):
            llm.chat(MSGS[:1], params, chat_template=template, tools=bad)
