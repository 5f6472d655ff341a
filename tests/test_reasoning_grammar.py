"""A grammar held back while a thinking model reasons (``StructuredOutputsParams.starts_after``; vLLM holds a
grammar until its reasoning parser sees the end of the reasoning): the gate's rule, the manager's masks and
matchers, and the engine end to end on the demo model, synchronous and asynchronous, with the reasoning ended
deterministically by ``thinking_token_budget`` (the demo model does not think by itself)."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import jsonschema
import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.engine.structured_output import StructuredOutputManager
from minivllm.engine.structured_output.reasoning_gate import ReasoningGate
from minivllm.sampling_params import StructuredOutputsParams as SO
from tests.helpers.json_schemas import SCHEMAS
from tests.helpers.server_utils import ROOT

DEMO = str(ROOT / "models" / "minivllm-demo-py")
MARKERS = {"reasoning_start_str": "<think>", "reasoning_end_str": "</think>"}
PROMPT = "Return JSON describing a person:\n<think>\n"  # a prompt that leaves the model reasoning


def test_the_gate_opens_once_the_output_ends_with_the_marker():
    gate = ReasoningGate((5, 5, 6))
    assert [gate.push(t) for t in (5, 5, 5, 1, 5, 5)] == [False] * 6
    assert gate.push(6)  # 5 5 5 5 6: the marker overlaps itself
    one = ReasoningGate((7,))
    assert [one.push(t) for t in (3, 7)] == [False, True]


def test_starting_after_copies_the_constraint_and_checks_the_ids():
    so = SO(json=SCHEMAS["point"])
    gated = so.starting_after([4, 5])
    assert gated.starts_after == (4, 5) and so.starts_after == () and gated.key() == so.key()
    for bad in ([], [1, -2], ["x"], [True]):
        with pytest.raises(ValueError, match=r"structured_outputs\.starts_after"):
            so.starting_after(bad)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(DEMO)


def test_a_closed_gate_leaves_the_row_free_and_the_matcher_where_it_was(tokenizer):
    manager = StructuredOutputManager(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    template = manager.prepare(SO(choice=["yes", "no"]))
    end = tuple(tokenizer.encode("</think>", add_special_tokens=False))
    manager.start(1, template, end)
    manager.start(2, template)
    step = SimpleNamespace(sampled=[SimpleNamespace(seq_id=i, num_draft_tokens=0, token_ids=(0,)) for i in (1, 2)])
    assert manager.constrains(step)  # a closed gate still waits for masks: the step in flight may open it
    masks = manager.bitmask(step)
    assert masks.rows == (1,)  # only the ungated row is masked
    for token in tokenizer.encode("maybe not", add_special_tokens=False):  # the grammar would refuse these
        assert manager.accept(1, token) is False
    for token in end[:-1]:
        assert manager.accept(1, token) is False and 1 in manager.gates
    assert manager.accept(1, end[-1]) is False and 1 not in manager.gates
    manager.check_integrity()
    masks = manager.bitmask(step)
    assert masks.rows == (0, 1)
    assert torch.equal(masks.bitmask[0], masks.bitmask[1])  # seq 1's grammar starts where seq 2's is: unmoved
    manager.start(3, template, end)
    manager.drop(3)
    assert 3 not in manager.gates and 3 not in manager.grammars
    manager.gates[9] = ReasoningGate(end)
    with pytest.raises(AssertionError, match="gates of sequences without a grammar"):
        manager.check_integrity()
    manager.close()


def _allowed(mask_row: torch.Tensor, token: int) -> bool:
    return bool((int(mask_row[token // 32]) >> (token % 32)) & 1)


def test_an_undecided_gate_lets_the_first_token_open_the_reasoning(tokenizer):
    """``opened_by``: the first token may also be the start token; taking it closes the gate, any other token is
    the grammar's own."""
    manager = StructuredOutputManager(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    template = manager.prepare(SO(choice=["yes", "no"]))
    start, end = 96, (34,)  # "~" opens, "@" closes
    yes = tokenizer.encode("yes", add_special_tokens=False)
    step = SimpleNamespace(sampled=[SimpleNamespace(seq_id=i, num_draft_tokens=0, token_ids=(0,)) for i in (1, 2)])
    manager.start(1, template, end, opened_by=start)
    manager.start(2, template)
    masks = manager.bitmask(step)
    assert masks.rows == (0, 1) and _allowed(masks.bitmask[0], start) and not _allowed(masks.bitmask[1], start)
    other = masks.bitmask[0].clone()
    other[start // 32] ^= torch.tensor(1 << (start % 32), dtype=torch.int64).to(torch.int32)
    assert torch.equal(other, masks.bitmask[1])  # the grammar's tokens and the start token, nothing more
    assert manager.accept(1, start) is False and manager.gates[1].undecided is False  # the model reasons
    assert manager.bitmask(step).rows == (1,)
    assert manager.accept(1, yes[0]) is False and manager.accept(1, end[0]) is False and 1 not in manager.gates
    manager.start(3, template, end, opened_by=start)
    done = [manager.accept(3, t) for t in yes]
    assert 3 not in manager.gates and done[-1] is True  # no reasoning: the grammar took "yes", which is complete
    manager.check_integrity()
    manager.close()


@pytest.fixture(scope="module", params=[False, True], ids=["sync", "async"])
def llm(request):
    with LLM(DEMO, device="cpu", async_scheduling=request.param, reasoning_config=MARKERS) as engine:
        yield engine


def _split(llm, token_ids):
    """(reasoning ids with the end marker, the rest) of an output whose reasoning ended."""
    end = llm.engine.tokenizer.encode("</think>", add_special_tokens=False)
    k = next(i for i in range(len(token_ids)) if token_ids[i:i + len(end)] == end) + len(end)
    return token_ids[:k], token_ids[k:]


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_the_model_reasons_freely_then_the_grammar_applies(llm, temperature):
    end = llm.engine.tokenizer.encode("</think>", add_special_tokens=False)
    schema = SCHEMAS["person"]
    budgets = (0, 3, 9)
    free = [SamplingParams(temperature=temperature, seed=b, max_tokens=b + len(end), thinking_token_budget=b)
            for b in budgets]
    gated = [SamplingParams(temperature=temperature, seed=b, max_tokens=200, thinking_token_budget=b,
                            structured_outputs=SO(json=schema).starting_after(end)) for b in budgets]
    outs = llm.generate([PROMPT] * 6, free + gated, use_tqdm=False)
    for budget, alone, out in zip(budgets, outs[:3], outs[3:]):
        reasoning, answer = _split(llm, out["token_ids"])
        assert len(reasoning) <= budget + len(end)  # the model may write the marker before the budget forces it
        assert reasoning == alone["token_ids"][:len(reasoning)], (budget, out["text"])  # no mask while reasoning
        assert out["finish_reason"] == "stop", out["text"]
        jsonschema.validate(json.loads(llm.engine.decode(answer)), schema)
    assert not llm.engine.structured.grammars and not llm.engine.structured.gates


def test_rows_beside_a_gated_one_keep_their_behaviour(llm):
    end = llm.engine.tokenizer.encode("</think>", add_special_tokens=False)
    free = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    (alone,) = llm.generate(["def parse("], free, use_tqdm=False)
    constrained = SamplingParams(temperature=0, max_tokens=100, structured_outputs=SO(json=SCHEMAS["point"]))
    gated = SamplingParams(temperature=0, max_tokens=100, thinking_token_budget=5,
                           structured_outputs=SO(json=SCHEMAS["point"]).starting_after(end))
    outs = llm.generate(["def parse(", PROMPT, PROMPT], [free, constrained, gated], use_tqdm=False)
    assert outs[0]["token_ids"] == alone["token_ids"]
    jsonschema.validate(json.loads(outs[1]["text"]), SCHEMAS["point"])  # ungated: JSON from the first token
    assert not outs[1]["text"].startswith("<")
    reasoning, answer = _split(llm, outs[2]["token_ids"])
    assert len(reasoning) <= 5 + len(end)
    jsonschema.validate(json.loads(llm.engine.decode(answer)), SCHEMAS["point"])
    llm.engine.structured.check_integrity()


def test_a_gate_that_never_opens_leaves_the_output_free(llm):
    """Cut by max_tokens inside the reasoning: exactly the unconstrained output."""
    end = llm.engine.tokenizer.encode("</think>", add_special_tokens=False)
    free = SamplingParams(temperature=0, max_tokens=12, thinking_token_budget=40)
    gated = SamplingParams(temperature=0, max_tokens=12, thinking_token_budget=40,
                           structured_outputs=SO(choice=["a", "b"]).starting_after(end))
    a, b = llm.generate([PROMPT, PROMPT], [free, gated], use_tqdm=False)
    assert a["token_ids"] == b["token_ids"] and b["finish_reason"] == "length"
    assert not llm.engine.structured.gates


@pytest.mark.parametrize("at", [1, 4])
def test_the_token_after_the_marker_is_masked_with_a_step_in_flight(llm, at):
    """Without a thinking budget nothing reads the newest token before the next step launches: with asynchronous
    scheduling, the step that samples the marker's last token is still in flight when the next one is queued,
    and that next token must follow the grammar all the same. The marker here is two tokens of the model's own
    greedy output, ending at output position ``at``."""
    free = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    (alone,) = llm.generate([PROMPT], free, use_tqdm=False)
    ids = alone["token_ids"]
    marker = tuple(ids[at - 1:at + 1])
    assert all(tuple(ids[i - 1:i + 1]) != marker for i in range(1, at)), "the marker must first end at `at`"
    gated = SamplingParams(temperature=0, max_tokens=100,
                           structured_outputs=SO(json=SCHEMAS["point"]).starting_after(marker))
    (out,) = llm.generate([PROMPT], gated, use_tqdm=False)
    assert out["token_ids"][:at + 1] == ids[:at + 1]
    jsonschema.validate(json.loads(llm.engine.decode(out["token_ids"][at + 1:])), SCHEMAS["point"])
    assert out["finish_reason"] == "stop"


# ------------------------------------------------------------------ reading the output back (the server's reader)
THINKING_TAIL, CLOSED_TAIL, PLAIN_TAIL = "<|im_start|>assistant\n<think>\n", "assistant\n<think>\n\n</think>\n\n", "t\n"
NAMED = {"type": "function", "function": {"name": "f"}}


def _reader(choice, tail):
    from minivllm.entrypoints.openai.chat_outputs import ChatOutputReader
    from minivllm.entrypoints.openai.protocol import NamedToolChoice

    choice = NamedToolChoice.model_validate(choice) if isinstance(choice, dict) else choice
    return ChatOutputReader(choice, "hermes", "qwen3", tail)


def _streamed(reader, pieces):
    """(reasoning, content, {index: [name, arguments]}) put back together from a streamer's deltas."""
    st = reader.streamer()
    reasoning, content, calls = "", "", {}
    for delta in [st.feed(p) for p in pieces] + [st.finish()]:
        if delta is None:
            continue
        reasoning += delta.reasoning or ""
        content += delta.content or ""
        for c in delta.tool_calls or []:
            call = calls.setdefault(c.index, ["", ""])
            call[0] += c.function.name or ""
            call[1] += c.function.arguments or ""
    return reasoning, content, calls, st.num_calls


@pytest.mark.parametrize("cut", [1, 5, 9, 17])
def test_a_forced_call_after_the_reasoning_is_read_whole_and_streamed(cut):
    text = 'I should call f.</think>{"a":1}'
    named = _reader(NAMED, THINKING_TAIL)
    assert named.reasoning_markers == ("<think>", "</think>") and named.thinking is True
    msg = named.message(text)
    assert msg.reasoning == "I should call f." and msg.content is None
    assert [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls] == [("f", {"a": 1})]
    assert _streamed(named, [text[:cut], text[cut:]]) == ("I should call f.", "", {0: ["f", '{"a":1}']}, 1)
    text = 'Two calls.</think>[{"name":"f","parameters":{}},{"name":"g","parameters":{"b":2}}]'
    required = _reader("required", THINKING_TAIL)
    msg = required.message(text)
    assert msg.reasoning == "Two calls." and [c.function.name for c in msg.tool_calls] == ["f", "g"]
    reasoning, content, calls, n = _streamed(required, [text[:cut], text[cut:]])
    assert (reasoning, content, n) == ("Two calls.", "", 2) and calls[1] == ["g", '{"b": 2}']


def test_a_reasoning_cut_short_has_no_call_and_unthinking_prompts_read_as_before():
    for choice in (NAMED, "required"):
        msg = _reader(choice, THINKING_TAIL).message("still thinking")
        assert msg.reasoning == "still thinking" and not msg.tool_calls and msg.content is None
        assert _streamed(_reader(choice, THINKING_TAIL), ["still ", "thinking"]) == ("still thinking", "", {}, 0)
    closed = _reader(NAMED, CLOSED_TAIL)  # thinking off: the grammar starts at once, the whole output is the call
    assert closed.reasoning_markers is None and closed.reasoning is None
    msg = closed.message('{"a":1}')
    assert msg.reasoning is None and msg.tool_calls[0].function.name == "f"
    assert _reader("none", CLOSED_TAIL).reasoning_markers is None
    undecided = _reader(NAMED, PLAIN_TAIL)  # the model may open its reasoning, or answer at once
    assert undecided.reasoning_markers == ("<think>", "</think>") and undecided.thinking is None
    for text, reasoning in (('{"a":1}', None), ('<think>\nhm\n</think>{"a":1}', "\nhm\n")):
        msg = undecided.message(text)
        assert msg.reasoning == reasoning and json.loads(msg.tool_calls[0].function.arguments) == {"a": 1}, msg
        assert _streamed(undecided, [text[:3], text[3:]])[2] == {0: ["f", '{"a":1}']}


def test_after_reasoning_holds_the_grammar_as_the_prompt_decided():
    from minivllm.entrypoints.openai.structured import after_reasoning

    so = SO(json=SCHEMAS["point"])
    held = after_reasoning(so, True, [1, 2], [3, 4])
    assert (held.starts_after, held.opened_by) == ((3, 4), None)  # the prompt opened the think block
    maybe = after_reasoning(so, None, [7], [8])
    assert (maybe.starts_after, maybe.opened_by) == ((8,), 7)  # undecided: the first token may open it
    assert after_reasoning(so, None, [1, 2], [3]) is so  # a start marker of several tokens cannot be one token
    assert after_reasoning(so, False, [7], [8]) is so and after_reasoning(None, True, [7], [8]) is None


def test_an_undecided_prompt_reasons_only_if_the_model_opens_the_reasoning():
    """A prompt that neither opened nor closed the reasoning (``opened_by``): the markers here are one token each
    ("@" opens, "~" closes); the prompt ends with "@" so that ``thinking_token_budget`` counts from it, and the
    token that may open the reasoning is the model's own greedy first token."""
    with LLM(DEMO, device="cpu", async_scheduling=True,
             reasoning_config={"reasoning_start_str": "@", "reasoning_end_str": "~"}) as llm:
        tok = llm.engine.tokenizer
        prompt, end = "Return JSON describing a person:\n@", tok.encode("~", add_special_tokens=False)
        schema = SCHEMAS["point"]
        budget, caret = 4, tok.encode("^", add_special_tokens=False)[0]
        unlikely = {caret: -100.0}  # "^" may open the reasoning, but the model will not write it
        free, ungated = llm.generate([prompt] * 2, [
            SamplingParams(temperature=0, max_tokens=budget + 1, thinking_token_budget=budget),
            SamplingParams(temperature=0, max_tokens=100, structured_outputs=SO(json=schema), logit_bias=unlikely)],
            use_tqdm=False)
        first = free["token_ids"][0]
        assert not ungated["token_ids"][0] == first  # the grammar alone would refuse the model's first token
        opens, stays = (SamplingParams(temperature=0, max_tokens=100, thinking_token_budget=b, logit_bias=unlikely,
                                       structured_outputs=SO(json=schema).starting_after(end, opened_by=t))
                        for t, b in ((first, budget), (caret, None)))
        a, b = llm.generate([prompt] * 2, [opens, stays], use_tqdm=False)
        assert a["token_ids"][:budget + 1] == free["token_ids"]  # it opened, reasoned freely, then "~" was forced
        jsonschema.validate(json.loads(llm.engine.decode(a["token_ids"][budget + 1:])), schema)
        assert b["token_ids"] == ungated["token_ids"]  # the first token was the grammar's: as without a gate
        # a start token that the grammar takes is the grammar's
        regex = SO(regex=r"\^[a-z]{3}").starting_after(end, opened_by=tok.encode("^", add_special_tokens=False)[0])
        (c,) = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=20, structured_outputs=regex),
                            use_tqdm=False)
        assert re.fullmatch(r"\^[a-z]{3}", c["text"]) and c["finish_reason"] == "stop", c
        assert not llm.engine.structured.gates
