"""vLLM's ``POST /v1/decisions`` over HTTP, against ``minivllm serve`` of the demo model: each answer is the
label probabilities of one greedy token after the question's chat prompt, the same numbers the chat endpoint
gives for that prompt with ``logprob_token_ids``; vLLM's shapes, and a 400 naming the field for what it refuses."""

from __future__ import annotations

import math

import httpx
import pytest
from transformers import AutoTokenizer

from tests.helpers.server_utils import ROOT, running_server

pytestmark = [pytest.mark.server,
              pytest.mark.skipif(not (ROOT / "models" / "minivllm-demo-py").is_dir(), reason="no demo model")]
DEMO = str(ROOT / "models" / "minivllm-demo-py")
NAME = "demo"
TEXT = "The package arrived with a broken screen."
QUESTIONS = [
    {"type": "predicate", "instructions": "Is the screen broken?"},
    {"type": "choice", "name": "department", "instructions": "Which department should handle this?",
     "choices": [{"value": "returns", "description": "sends a new one"}, {"value": "billing"}, {"value": True}]},
    {"type": "score", "name": "damage", "instructions": "Rate the damage.",
     "levels": [{"label": "undamaged"}, {"label": "scratched"}, {"label": "broken"}]},
]
# the user turn of each read (vLLM's wording): the input, the question, its options labelled A, B, ...
PROMPTS = [
    f"{TEXT}\n\nQuestion: Is the screen broken?\nA: false\nB: true\nAnswer with the letter of one option only.",
    f"{TEXT}\n\nQuestion: Which department should handle this?\nA: \"returns\" - sends a new one\nB: \"billing\"\n"
    "C: true\nAnswer with the letter of one option only.",
    f"{TEXT}\n\nQuestion: Rate the damage.\nA: undamaged\nB: scratched\nC: broken\n"
    "Answer with the letter of one option only.",
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(DEMO, ["--served-model-name", NAME, "--device", "cpu", "--max-model-len", "512"],
                        tmp_path_factory.mktemp("decisions")) as srv:
        yield srv


def decide(server, body: dict, status: int = 200) -> dict:
    r = httpx.post(server.url + "/v1/decisions", json={"model": NAME, "input": TEXT, **body}, timeout=60)
    assert r.status_code == status, r.text
    return r.json()


def label_probs(server, content: str, n: int) -> tuple[list[float], float]:
    """The chat endpoint's read of ``content``: the first n labels' probabilities among themselves, and their
    share of the vocabulary."""
    tok = AutoTokenizer.from_pretrained(DEMO)
    ids = [tok.convert_tokens_to_ids(letter) for letter in "ABC"[:n]]
    r = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
        "model": NAME, "messages": [{"role": "user", "content": content}], "max_tokens": 1, "temperature": 0,
        "logprobs": True, "logprob_token_ids": ids, "return_tokens_as_token_ids": True,
        "chat_template_kwargs": {"enable_thinking": False}})
    assert r.status_code == 200, r.text
    (first,) = r.json()["choices"][0]["logprobs"]["content"]
    got = {int(t["token"].removeprefix("token_id:")): t["logprob"] for t in first["top_logprobs"]}
    weights = [math.exp(got[i]) for i in ids]
    return [w / sum(weights) for w in weights], sum(weights)


def test_each_answer_is_the_label_probabilities_of_its_read(server):
    body = decide(server, {"questions": QUESTIONS})
    assert set(body) == {"model", "answers", "usage"} and body["model"] == NAME
    predicate, choice, score = body["answers"]
    probs, _ = label_probs(server, PROMPTS[0], 2)
    assert predicate == {"type": "predicate", "name": None, "probability": pytest.approx(probs[1], abs=1e-5)}
    probs, mass = label_probs(server, PROMPTS[1], 3)
    assert [p["value"] for p in choice["probabilities"]] == ["returns", "billing", True]
    assert [p["probability"] for p in choice["probabilities"]] == pytest.approx(probs, abs=1e-5)
    top = max(range(3), key=probs.__getitem__)
    assert choice["choice"] == ["returns", "billing", True][top] and choice["name"] == "department"
    assert choice["confidence"] == pytest.approx(probs[top] * mass, abs=1e-5)
    probs, _ = label_probs(server, PROMPTS[2], 3)
    assert [(p["value"], p["label"]) for p in score["probabilities"]] == [(0, "undamaged"), (1, "scratched"),
                                                                         (2, "broken")]
    assert score["score"] == pytest.approx(sum(i * p for i, p in enumerate(probs)), abs=1e-5)
    usage = body["usage"]
    assert usage["output_tokens"] == 3 and usage["total_tokens"] == usage["input_tokens"] + 3


def test_message_input_reads_as_its_texts(server):
    parts = [{"role": "user", "content": [{"type": "input_text", "text": "The package arrived"},
                                          {"type": "input_text", "text": "with a broken screen."}]}]
    joined = decide(server, {"input": parts, "questions": QUESTIONS[:1]})["answers"]
    text = decide(server, {"input": "The package arrived\nwith a broken screen.", "questions": QUESTIONS[:1]})
    assert joined == text["answers"]


@pytest.mark.parametrize("body, param, words", [
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]},
     None, "text input only"),
    ({"joint": True}, "joint", "joint"),
    ({"cache_salt": "salt"}, "cache_salt", "cache_salt"),
    ({"questions": [{"type": "choice", "instructions": "?", "choices": [{"value": str(i)} for i in range(27)]}]},
     "questions", "at most 26"),
    ({"questions": [{"type": "choice", "instructions": "?", "choices": [{"value": "a"}, {"value": "a"}]}]},
     None, "distinct"),
    ({"questions": []}, None, "questions"),
    ({"temperature": 0.5}, None, "temperature"),
])
def test_what_it_refuses_gets_a_400(server, body, param, words):
    err = decide(server, {"questions": QUESTIONS[:1], **body}, 400)["error"]
    assert words in err["message"] and (param is None or err["param"] == param)


def test_another_model_is_a_404(server):
    assert decide(server, {"model": "other", "questions": QUESTIONS[:1]}, 404)["error"]["code"] == "model_not_found"


def test_label_tokens_when_the_prompt_tail_merges_otherwise():
    """The chat model's prompt ends in a "\\n\\n" token after ``</think>``, and its tokenizer reads "\\n\\nA" as three
    tokens: each label is then its own single token (what the model emits after the fixed prompt), distinct; a
    tokenizer whose label is several tokens gets the 501."""
    from minivllm.entrypoints.openai.errors import APIError
    from minivllm.entrypoints.openai.serving_decisions import LABELS, label_token_ids

    tok = AutoTokenizer.from_pretrained(ROOT / "models" / "minivllm-demo-chat")
    tail = tok.encode("\n\n", add_special_tokens=False)
    assert tok.encode("\n\nA", add_special_tokens=False)[:-1] != tail  # the case this handles
    ids = label_token_ids(tok, tail)
    assert ids == [tok.encode(label, add_special_tokens=False)[0] for label in LABELS] and len(set(ids)) == len(ids)

    class Merging:  # every label two tokens
        def decode(self, ids):
            return ""

        def encode(self, text, add_special_tokens=False):
            return [ord(c) for c in text] * 2

    with pytest.raises(APIError) as err:
        label_token_ids(Merging(), [])
    assert err.value.status == 501
