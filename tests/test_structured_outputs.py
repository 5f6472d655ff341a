"""Structured outputs offline, on the demo model (which knows no JSON: the grammar alone makes outputs valid):
the twenty schemas, regex, choice and grammars; free rows untouched beside constrained ones; compilation off
the engine thread, cached; errors that name the field."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import jsonschema
import pytest

from minivllm import LLM, SamplingParams
from minivllm.sampling_params import StructuredOutputsParams as SO
from tests.helpers.json_schemas import SCHEMAS

DEMO = str(Path(__file__).resolve().parents[1] / "models" / "minivllm-demo-py")
PROMPT = "Return JSON describing a person:\n"


@pytest.fixture(scope="module", params=[False, True], ids=["sync", "async"])
def llm(request):
    with LLM(DEMO, device="cpu", async_scheduling=request.param) as engine:
        yield engine


def _gen(llm, constraints, temperature=0.0, max_tokens=200, prompts=None, **kw):
    params = [SamplingParams(temperature=temperature, max_tokens=max_tokens, structured_outputs=c, **kw)
              for c in constraints]
    return llm.generate(prompts or [PROMPT] * len(params), params, use_tqdm=False)


def test_every_schema_gives_valid_json_greedy_and_sampled(llm):
    outs = _gen(llm, [SO(json=s) for s in SCHEMAS.values()])
    outs += _gen(llm, [SO(json=s) for s in SCHEMAS.values()], temperature=1.0, seed=7)
    for (name, schema), out in zip(list(SCHEMAS.items()) * 2, outs):
        assert out["finish_reason"] == "stop", (name, out["text"])
        jsonschema.validate(json.loads(out["text"]), schema)


def test_regex_choice_and_grammars_match_in_full(llm):
    cases = [SO(regex=r"[0-9]{3}-[a-z]{2,5}"), SO(choice=["yes", "no", 'say "maybe"\nthen']),
             SO(grammar='start: "def " NAME "():"\nNAME: /[a-z_]{1,12}/'), SO(grammar='root ::= "x = " [0-9] [0-9]?')]
    for seed in range(3):
        a, b, c, d = _gen(llm, cases, temperature=1.0, seed=seed)
        assert re.fullmatch(r"[0-9]{3}-[a-z]{2,5}", a["text"]), a
        assert b["text"] in ("yes", "no", 'say "maybe"\nthen'), b
        assert re.fullmatch(r"def [a-z_]{1,12}\(\):", c["text"]), c
        assert re.fullmatch(r"x = [0-9]{1,2}", d["text"]), d
        assert {o["finish_reason"] for o in (a, b, c, d)} == {"stop"}


def test_free_rows_keep_their_greedy_tokens_beside_constrained_ones(llm):
    prompts = ["def parse(", "import os\n", "class Stack:\n", "# sort a list\n"]
    free = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    alone = llm.generate(prompts, free, use_tqdm=False)
    mixed_params = []
    for i in range(len(prompts)):
        mixed_params += [free, SamplingParams(temperature=0, max_tokens=24, structured_outputs=SO(
            json=list(SCHEMAS.values())[i]))]
    mixed = llm.generate([p for p in prompts for _ in range(2)], mixed_params, use_tqdm=False)
    assert [o["token_ids"] for o in mixed[::2]] == [o["token_ids"] for o in alone]


def test_the_grammar_ends_the_output_even_with_ignore_eos(llm):
    (out,) = _gen(llm, [SO(choice=["alpha", "beta"])], ignore_eos=True, max_tokens=50)
    assert out["text"] in ("alpha", "beta") and out["finish_reason"] == "stop"


def test_n_sequences_each_follow_their_own_grammar(llm):
    (out,) = llm.generate([PROMPT], SamplingParams(n=3, temperature=1.0, seed=1, max_tokens=100,
                                                   structured_outputs=SO(json=SCHEMAS["person"])), use_tqdm=False)
    assert len(out["outputs"]) == 3
    for c in out["outputs"]:
        jsonschema.validate(json.loads(c["text"]), SCHEMAS["person"])


def test_chunked_prefill_then_a_constrained_first_token():
    with LLM(DEMO, device="cpu", max_num_batched_tokens=16, max_model_len=512, async_scheduling=True) as llm:
        (out,) = _gen(llm, [SO(json=SCHEMAS["nested_address"])], prompts=["x = 1\n" * 30])
        jsonschema.validate(json.loads(out["text"]), SCHEMAS["nested_address"])


@pytest.mark.parametrize("so, field", [
    (dict(json={"type": "object", "properties": {"a": {"type": "nosuchtype"}}}), "structured_outputs.json"),
    (dict(regex="[0-9"), "structured_outputs.regex"),
    (dict(grammar="start: undefined_rule"), "structured_outputs.grammar"),
])
def test_an_invalid_constraint_is_a_value_error_naming_the_field(llm, so, field):
    with pytest.raises(ValueError, match=re.escape(field)):
        llm.generate([PROMPT, "def f("], [SamplingParams(), SamplingParams(structured_outputs=SO(**so))], use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()  # nothing of the batch was added


def test_compiling_runs_off_the_engine_thread_and_is_cached():
    with LLM(DEMO, device="cpu") as llm:
        engine = llm.engine
        gate, compiled = threading.Event(), []
        real = engine.structured.backend.compile

        def slow_compile(so):
            gate.wait(30)
            compiled.append(so.kind)
            return real(so)
        engine.structured.backend.compile = slow_compile
        slow = engine.add_request(PROMPT, SamplingParams(temperature=0, max_tokens=60,
                                                          structured_outputs=SO(json=SCHEMAS["point"])))
        free = engine.add_request("def f(", SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
        done = {}
        for _ in range(12):  # the free request finishes while the grammar is still compiling
            for out in engine.step()[0]:
                if out.finished:
                    done[out.request_id] = out
        assert free in done and slow not in done and compiled == []
        assert engine.structured.num_compiling == 1
        gate.set()
        while slow not in done:
            for out in engine.step()[0]:
                if out.finished:
                    done[out.request_id] = out
        jsonschema.validate(json.loads(done[slow].outputs[0].text), SCHEMAS["point"])
        again = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=60,
                                                      structured_outputs=SO(json=SCHEMAS["point"])), use_tqdm=False)
        assert compiled == ["json"] and again[0]["text"] == done[slow].outputs[0].text  # compiled once
        assert not engine.structured.grammars  # every sequence's grammar state is gone


def test_aborting_a_request_that_waits_for_its_grammar():
    with LLM(DEMO, device="cpu") as llm:
        engine = llm.engine
        gate = threading.Event()
        real = engine.structured.backend.compile
        engine.structured.backend.compile = lambda so: (gate.wait(30), real(so))[1]
        rid = engine.add_request(PROMPT, SamplingParams(structured_outputs=SO(regex="[a-z]+")))
        engine.abort_request(rid)
        gate.set()
        engine.step()
        assert not engine.has_unfinished_requests() and not engine.structured.num_compiling
        engine.scheduler.check_integrity()
