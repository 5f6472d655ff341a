"""``thinking_token_budget`` (vLLM's): the reasoning between ``--reasoning-config``'s markers gets at most that
many tokens, then its end marker is forced; the rule read off the tokens, the parameter's checks, and the
engine end to end on the demo model."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minivllm.config.reasoning import ReasoningConfig
from minivllm.config.sampling import SamplingConfig
from minivllm.core.thinking_budget import ThinkingBudget, ThinkingTracker
from minivllm.sampling_params import SamplingParams
from tests.helpers.server_utils import ROOT

DEMO = ROOT / "models" / "minivllm-demo-py"
START, END = (7, 8), (9, 10, 11)


def _budget(n: int) -> ThinkingBudget:
    return ThinkingBudget(START, END, n)


def test_no_start_marker_means_no_forcing():
    assert _budget(0).forced_token([1, 2, 3]) is None
    assert _budget(0).forced_token([7, 1, 8]) is None  # not the whole marker


def test_the_end_is_forced_once_the_budget_is_spent_one_token_at_a_time():
    b = _budget(2)
    assert b.forced_token([1, 7, 8]) is None
    assert b.forced_token([1, 7, 8, 5]) is None
    assert b.forced_token([1, 7, 8, 5, 6]) == 9
    assert b.forced_token([1, 7, 8, 5, 6, 9]) == 10  # the forcing under way is not reasoning
    assert b.forced_token([1, 7, 8, 5, 6, 9, 10]) == 11
    assert b.forced_token([1, 7, 8, 5, 6, 9, 10, 11]) is None  # closed: free again
    assert b.forced_token([1, 7, 8, 5, 6, 9, 10, 11, 4, 4, 4]) is None
    assert _budget(0).forced_token([7, 8]) == 9


@settings(max_examples=300, deadline=None)
@given(prompt=st.lists(st.sampled_from([1, 7, 8, 9, 10, 11]), min_size=1, max_size=12),
       steps=st.lists(st.lists(st.sampled_from([2, 7, 8, 9, 10, 11]), min_size=1, max_size=3), max_size=25),
       budget=st.integers(0, 4))
def test_the_tracker_reading_new_tokens_only_answers_as_the_whole_sequence_does(prompt, steps, budget):
    """``ThinkingTracker`` (what a sequence uses each step) equals ``ThinkingBudget.forced_token`` on the whole
    token list after every step, markers split across steps, repeated and nested included."""
    b = _budget(budget)
    tracker, tokens = ThinkingTracker(b), list(prompt)
    assert tracker.forced_token(tokens) == b.forced_token(tokens)
    for new in steps:
        tokens += new
        assert tracker.forced_token(tokens) == b.forced_token(tokens), tokens


def test_a_closed_block_in_the_prompt_does_not_count_and_a_later_one_does():
    b = _budget(1)
    assert b.forced_token([7, 8, 1, 1, 1, 9, 10, 11, 2, 2, 2]) is None  # an earlier turn's reasoning
    assert b.forced_token([7, 8, 1, 9, 10, 11, 2, 7, 8, 3]) == 9  # a new block opened after it
    assert _budget(2).forced_token([7, 8, 5, 9]) is None  # the model began the end marker within the budget
    assert _budget(2).forced_token([7, 8, 5, 6, 9]) == 10  # ... and at it: the rest of the marker is forced


@pytest.mark.parametrize("value", [-2, 1.5, "3"])
def test_a_bad_budget_is_a_value_error_naming_it(value):
    with pytest.raises(ValueError, match="thinking_token_budget"):
        SamplingParams(thinking_token_budget=value)


def test_minus_one_is_no_budget_and_the_config_takes_json():
    assert SamplingParams(thinking_token_budget=-1).thinking_token_budget is None
    config = SamplingConfig(reasoning_config='{"reasoning_start_str": "<think>", "reasoning_end_str": "</think>"}')
    assert config.reasoning_config == ReasoningConfig("<think>", "</think>") and config.reasoning_config.enabled
    with pytest.raises(ValueError, match="reasoning_config: unknown key"):
        SamplingConfig(reasoning_config='{"start": "<think>"}')


def _count_between(ids: list[int], start: list[int], end: list[int]) -> int | None:
    """vLLM's test's count: tokens after the last start marker, up to the first end marker after it."""
    s = max((i for i in range(len(ids) - len(start) + 1) if ids[i:i + len(start)] == start), default=-1)
    if s < 0:
        return None
    after = s + len(start)
    e = next((j for j in range(after, len(ids) - len(end) + 1) if ids[j:j + len(end)] == end), len(ids))
    return e - after


@pytest.mark.slow
def test_the_engine_caps_the_reasoning_at_the_budget():
    from minivllm import LLM

    llm = LLM(str(DEMO), device="cpu", reasoning_config={"reasoning_start_str": "<think>",
                                                         "reasoning_end_str": "</think>"})
    tok = llm.get_tokenizer()
    start, end = (tok.encode(s, add_special_tokens=False) for s in ("<think>", "</think>"))
    # a prompt that opens the reasoning (as templates with thinking on do): the budget counts from there
    prompt = tok.encode("<|im_start|>user\nWhat is 1+1?<|im_end|>\n<|im_start|>assistant\n") + start
    for budget in (0, 1, 5, 9):
        for params in (SamplingParams(temperature=0.0, max_tokens=40, thinking_token_budget=budget),
                       SamplingParams(temperature=1.0, seed=budget, max_tokens=40, thinking_token_budget=budget)):
            (out,) = llm.generate([prompt], params, use_tqdm=False)
            ids = prompt + list(out["token_ids"])
            assert _count_between(ids, start, end) == budget, (budget, out["text"])
    (free,) = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=40), use_tqdm=False)
    assert _count_between(prompt + list(free["token_ids"]), start, end) > 9  # the demo model never closes it
    plain = LLM(str(DEMO), device="cpu")
    with pytest.raises(ValueError, match="reasoning_config is not configured"):
        plain.generate([prompt], SamplingParams(thinking_token_budget=3), use_tqdm=False)
