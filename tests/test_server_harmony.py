"""gpt-oss chats in the harmony format over HTTP through the official openai client, streamed and not, on a tiny
random gpt-oss with a harmony tokenizer and chat template (``tests/helpers/harmony_checkpoints.py``): forced
tool calls (the grammar makes the random model write one harmony call), calls and reasoning the model writes
itself under ``auto`` (a grammar stands in for a trained model), the follow-up turn with the tool's result, the
stop tokens, and bad input."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from tests.helpers.harmony_checkpoints import build_harmony_checkpoint
from tests.helpers.server_utils import chat_message, running_server

pytestmark = pytest.mark.server
ARGS = ["--served-model-name", "gpt-oss", "--device", "cpu", "--enable-auto-tool-choice", "--tool-call-parser",
        "openai", "--reasoning-parser", "openai_gptoss", "--max-model-len", "1024"]
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                     "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}}}
SEARCH = {"type": "function", "function": {"name": "search", "parameters": {
    "type": "object", "properties": {"query": {"type": "string", "maxLength": 16}},
    "required": ["query"], "additionalProperties": False}}}
TOOLS = [WEATHER, SEARCH]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = build_harmony_checkpoint(tmp_path_factory.mktemp("harmony-gpt-oss"), seed=5)
    with running_server(str(model), ARGS, tmp_path_factory.mktemp("harmony-server")) as srv:
        yield srv


def chat(server, stream: bool, **kw):
    """(message dict, finish_reason) of one chat completion; a stream is put back together from its deltas."""
    kw = {"model": "gpt-oss", "messages": USER, "temperature": 0, "max_tokens": 120, **kw}
    return chat_message(server.client, stream, **kw)


def _one_call(msg: dict, finish: str) -> tuple[str, dict]:
    assert finish == "tool_calls" and len(msg["tool_calls"]) == 1, (msg, finish)
    (call,) = msg["tool_calls"]
    assert call["id"].startswith("call_") and msg["content"] is None, msg
    name, args = call["function"]["name"], json.loads(call["function"]["arguments"])
    jsonschema.validate(args, PARAMS[name])
    return name, args


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_required_and_named_tool_choice_give_one_harmony_call(server, stream):
    """The grammar of one harmony call makes even the random model call a tool, with valid JSON arguments."""
    name, _ = _one_call(*chat(server, stream, tools=TOOLS, tool_choice="required"))
    assert name in PARAMS
    for fn in ("get_weather", "search"):
        named = {"type": "function", "function": {"name": fn}}
        assert _one_call(*chat(server, stream, tools=TOOLS, tool_choice=named))[0] == fn


# a trained gpt-oss writes these on its own; the grammar makes the random model write them, and goes on after
# <|call|> and <|return|>: only the checkpoint's stop tokens (its generation_config's) end the outputs there
AUTO_CALL = ('start: <|channel|> "analysis" <|message|> /[a-z ]{1,20}/ <|end|> <|start|> "assistant" <|channel|> '
             '"commentary to=functions.get_weather " <|constrain|> "json" <|message|> '
             '%json {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}, "unit": '
             '{"const": "celsius"}}, "required": ["city", "unit"], "additionalProperties": false, "x-guidance": {"whitespace_flexible": false}} '
             '<|call|> "never sent"')
FINAL = 'start: <|channel|> "final" <|message|> "It is " /[0-9]{1,2}/ "C." <|return|> "never sent"'


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_auto_reads_reasoning_and_a_call_the_model_writes(server, stream):
    """Reasoning on the analysis channel, then a call; ``<|call|>`` ends the turn with finish reason tool_calls."""
    msg, finish = chat(server, stream, tools=TOOLS, extra_body={"structured_outputs": {"grammar": AUTO_CALL}})
    assert msg["reasoning"] and "<|" not in msg["reasoning"], msg
    name, args = _one_call(msg, finish)
    assert name == "get_weather" and args["unit"] == "celsius"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_the_tool_result_turn_is_rendered_and_answered(server, stream):
    """The follow-up turn renders the call and the tool's result in harmony; the answer is the final channel,
    which ``<|return|>`` ends (a stop token of the checkpoint's generation_config: nothing after it is
    generated, and the finish reason is stop)."""
    msg, finish = chat(server, False, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    (call,) = msg["tool_calls"]
    history = USER + [{"role": "assistant", "content": None, "tool_calls": [call | {"type": "function"}]},
                      {"role": "tool", "tool_call_id": call["id"], "content": "20C and sunny"}]
    ids = httpx.post(f"{server.url}/tokenize", json={"model": "gpt-oss", "messages": history, "tools": TOOLS}).json()
    prompt = httpx.post(f"{server.url}/detokenize", json={"model": "gpt-oss", "tokens": ids["tokens"]}).json()["prompt"]
    args = json.dumps(json.loads(call["function"]["arguments"]), ensure_ascii=False)
    assert f"to=functions.get_weather <|constrain|>json<|message|>{args}<|call|>" in prompt, prompt
    assert prompt.endswith("<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>20C and sunny"
                           "<|end|><|start|>assistant"), prompt
    answer, finish = chat(server, stream, messages=history, tools=TOOLS,
                          extra_body={"structured_outputs": {"grammar": FINAL}})
    assert finish == "stop" and not answer["tool_calls"] and answer["reasoning"] is None, answer
    assert answer["content"].startswith("It is ") and answer["content"].endswith("C."), answer


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_response_format_constrains_the_final_answer(server, stream):
    """``response_format`` is the answer's format: the model writes a harmony final message whose text is JSON
    valid under the schema, and the content is that JSON."""
    schema = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}, "temp": {"type": "integer"}},
              "required": ["city", "temp"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "weather", "schema": schema}}
    msg, finish = chat(server, stream, response_format=fmt)
    assert finish == "stop" and not msg["tool_calls"] and msg["reasoning"] is None, msg
    jsonschema.validate(json.loads(msg["content"]), schema)


@pytest.mark.parametrize("body, param", [
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"messages": [{"role": "tool", "tool_call_id": "call_x", "content": "1"}]}, "messages"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"type": "no-such-type"}}}}}], "tool_choice": "required"}, "tool_choice"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}}},
     "response_format"),
])
def test_bad_input_is_a_400_naming_the_field(server, body, param):
    r = httpx.post(f"{server.url}/v1/chat/completions", json={"model": "gpt-oss", "messages": USER, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text
