"""Structured outputs and tool calls over HTTP through the official openai client, streamed and not, on the
demo model (which knows no JSON: the grammar alone makes its outputs valid)."""

from __future__ import annotations

import concurrent.futures
import json
import re

import httpx
import jsonschema
import pytest

from tests.helpers.json_schemas import SCHEMAS
from tests.helpers.server_utils import ROOT, chat_message, running_server

pytestmark = [pytest.mark.server,
              pytest.mark.skipif(not (ROOT / "models" / "minivllm-demo-py").is_dir(), reason="no demo model")]
DEMO = str(ROOT / "models" / "minivllm-demo-py")
ARGS = ["--served-model-name", "demo", "--device", "cpu", "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
        "--reasoning-parser", "qwen3", "--trust-request-chat-template"]
USER = [{"role": "user", "content": "Describe the object as JSON."}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                     "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}}}
SEARCH = {"type": "function", "function": {"name": "search", "parameters": {
    "type": "object", "properties": {"query": {"type": "string", "maxLength": 16},
                                     "limit": {"type": "integer", "minimum": 1, "maximum": 10}},
    "required": ["query", "limit"], "additionalProperties": False}}}
TOOL_PARAMS = {"get_weather": WEATHER["function"]["parameters"], "search": SEARCH["function"]["parameters"]}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(DEMO, ARGS, tmp_path_factory.mktemp("structured")) as srv:
        yield srv


def chat(server, stream: bool, **kw):
    """(message dict, finish_reason) of one chat completion; a stream is put back together from its deltas."""
    kw = {"model": "demo", "messages": USER, "temperature": 0, "max_tokens": 200, **kw}
    return chat_message(server.client, stream, **kw)


def _parallel(fn, items):
    with concurrent.futures.ThreadPoolExecutor(len(items)) as pool:
        return list(pool.map(fn, items))


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_twenty_json_schemas_through_response_format(server, stream):
    def one(item):
        name, schema = item
        fmt = {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}
        return chat(server, stream, response_format=fmt)
    for (name, schema), (msg, finish) in zip(SCHEMAS.items(), _parallel(one, list(SCHEMAS.items()))):
        assert finish == "stop", (name, msg)
        jsonschema.validate(json.loads(msg["content"]), schema)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_regex_choice_grammar_and_json_object_through_structured_outputs(server, stream):
    regex, choices = r"[A-Z][a-z]{2,6} [0-9]{2}", ["red", "green", "light blue"]
    for seed in range(3):
        extra = {"seed": seed, "temperature": 1.0}
        msg, _ = chat(server, stream, extra_body={"structured_outputs": {"regex": regex}}, **extra)
        assert re.fullmatch(regex, msg["content"]), msg
        msg, _ = chat(server, stream, extra_body={"structured_outputs": {"choice": choices}}, **extra)
        assert msg["content"] in choices, msg
        grammar = 'start: "x = " NUM ("+" NUM)?\nNUM: /[0-9]{1,3}/'
        msg, _ = chat(server, stream, extra_body={"structured_outputs": {"grammar": grammar}}, **extra)
        assert re.fullmatch(r"x = [0-9]{1,3}(\+[0-9]{1,3})?", msg["content"]), msg
    r = server.client.completions.create(model="demo", prompt="x = ", max_tokens=30, temperature=0,
                                         extra_body={"structured_outputs": {"regex": regex}})
    assert re.fullmatch(regex, r.choices[0].text)
    msg, finish = chat(server, stream, messages=[{"role": "user", "content": "{"}], response_format={"type": "json_object"})
    assert finish == "stop" and isinstance(json.loads(msg["content"]), dict), msg


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("choice", ["required", "named"])
def test_forced_tool_calls_parse_and_validate(server, stream, choice):
    tool_choice = "required" if choice == "required" else {"type": "function", "function": {"name": "search"}}
    for seed in range(4):
        msg, finish = chat(server, stream, tools=[WEATHER, SEARCH], tool_choice=tool_choice, seed=seed, temperature=1.0,
                           messages=[{"role": "user", "content": "What is the weather in Paris?"}])
        assert finish == "tool_calls" and msg["content"] is None and msg["tool_calls"], msg
        for call in msg["tool_calls"]:
            name = call["function"]["name"]
            assert choice == "required" or name == "search"
            assert call["id"].startswith("call_")
            jsonschema.validate(json.loads(call["function"]["arguments"]), TOOL_PARAMS[name])


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_named_call_cut_short_by_max_tokens_is_still_a_call(server, stream):
    """As vLLM: the call, with the arguments written so far, and finish_reason length (not an empty tool_calls
    with the partial JSON as content). Schemas without additionalProperties: false, as a client often sends."""
    long_text = {"type": "object", "properties": {"text": {"type": "string", "minLength": 40}}, "required": ["text"]}
    loose = {"type": "object", "properties": {"name": {"type": "string"}, "tags": {"type": "array"}}}
    for parameters, max_tokens in ((long_text, 8), (loose, 80)):
        tool = {"type": "function", "function": {"name": "describe", "parameters": parameters}}
        msg, finish = chat(server, stream, tools=[tool], max_tokens=max_tokens,
                           tool_choice={"type": "function", "function": {"name": "describe"}})
        assert msg["content"] is None and len(msg["tool_calls"]) == 1, msg
        (call,) = msg["tool_calls"]
        assert call["function"]["name"] == "describe" and call["id"].startswith("call_"), call
        arguments = call["function"]["arguments"]
        if finish == "tool_calls":  # it finished: the arguments are whole
            jsonschema.validate(json.loads(arguments), parameters)
        else:
            assert finish == "length" and arguments.startswith("{"), (finish, arguments)
        if parameters is long_text:
            assert finish == "length" and len(arguments) > 4, (finish, arguments)


def test_required_without_parallel_tool_calls_makes_exactly_one_call(server):
    for seed in range(3):
        msg, finish = chat(server, False, tools=[WEATHER, SEARCH], tool_choice="required", parallel_tool_calls=False,
                           seed=seed, temperature=1.0)
        assert finish == "tool_calls" and len(msg["tool_calls"]) == 1, msg
        (call,) = msg["tool_calls"]
        jsonschema.validate(json.loads(call["function"]["arguments"]), TOOL_PARAMS[call["function"]["name"]])


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_auto_tool_choice_reads_hermes_calls_and_reasoning(server, stream):
    # the demo model never calls tools on its own: a regex makes it write Qwen's syntax, which the parsers read
    regex = (r'<think>[a-z ]{1,20}</think>\n\nChecking\.\n<tool_call>\n\{"name": "get_weather", "arguments": '
             r'\{"city": "[A-Z][a-z]{2,8}", "unit": "celsius"\}\}\n</tool_call>')
    msg, finish = chat(server, stream, tools=[WEATHER], extra_body={"structured_outputs": {"regex": regex}})
    assert finish == "tool_calls", msg
    assert msg["reasoning"] and "<think>" not in msg["reasoning"] and msg["content"] == "Checking.", msg
    (call,) = msg["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    args = json.loads(call["function"]["arguments"])
    jsonschema.validate(args, TOOL_PARAMS["get_weather"])


OPTIONS = {"type": "object", "additionalProperties": False, "required": ["unit"],
           "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}, "days": {"type": "integer", "maximum": 7}}}
FORECAST = {"type": "function", "function": {"name": "forecast", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "options": {"$ref": "#/$defs/Opts"}},
    "required": ["city", "options"], "additionalProperties": False, "$defs": {"Opts": OPTIONS}}}}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_required_tool_choice_resolves_each_tools_defs(server, stream):
    """``required`` combines the tools into one schema: a tool's ``$defs`` move to its root, so ``#/$defs/...``
    still resolves (vLLM's), and the calls validate against the tool's own schema."""
    msg, finish = chat(server, stream, tools=[FORECAST, SEARCH], tool_choice="required", max_tokens=300,
                       messages=[{"role": "user", "content": "Forecast for Oslo?"}])
    assert finish == "tool_calls" and msg["tool_calls"], msg
    for call in msg["tool_calls"]:
        params = {**TOOL_PARAMS, "forecast": FORECAST["function"]["parameters"]}[call["function"]["name"]]
        jsonschema.validate(json.loads(call["function"]["arguments"]), params)


def test_two_tools_with_one_def_name_for_two_schemas_is_a_400(server):
    other = json.loads(json.dumps(FORECAST))
    other["function"]["name"] = "forecast2"
    other["function"]["parameters"]["$defs"]["Opts"] = {"type": "object"}
    r = httpx.post(server.url + "/v1/chat/completions", timeout=30, json={
        "model": "demo", "messages": USER, "tools": [FORECAST, other], "tool_choice": "required"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools", r.text


THINKING = r"<think>[a-z ]{5,20}</think>\n\nDone\."


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_reasoning_field_include_reasoning_and_reasoning_tokens(server, stream):
    """vLLM 0.33's names: the message's (and delta's) ``reasoning``; ``include_reasoning: false`` leaves it out
    while ``usage.completion_tokens_details.reasoning_tokens`` still counts it."""
    so = {"structured_outputs": {"regex": THINKING}}
    usage_opts = {"stream_options": {"include_usage": True}} if stream else {}
    kw = {"stream": True, **usage_opts} if stream else {}
    shown, hidden = ({**so, "include_reasoning": flag} for flag in (True, False))
    for body, with_reasoning in ((shown, True), (hidden, False)):
        r = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
            "model": "demo", "messages": USER, "temperature": 0, "max_tokens": 40, **body, **kw})
        assert r.status_code == 200, r.text
        if stream:
            events = [json.loads(line[6:]) for line in r.text.splitlines()
                      if line.startswith("data: {")]
            deltas = [c["delta"] for e in events for c in e["choices"]]
            assert not any("reasoning_content" in d for d in deltas)
            reasoning = "".join(d.get("reasoning") or "" for d in deltas)
            content = "".join(d.get("content") or "" for d in deltas)
            usage = events[-1]["usage"]
        else:
            body_json = r.json()
            message = body_json["choices"][0]["message"]
            assert "reasoning_content" not in message and "tool_calls" not in message, message
            reasoning, content, usage = message.get("reasoning") or "", message["content"], body_json["usage"]
        assert content == "Done.", (reasoning, content)
        assert bool(reasoning) == with_reasoning and "<think>" not in reasoning, reasoning
        n = usage["completion_tokens_details"]["reasoning_tokens"]
        assert 0 < n < usage["completion_tokens"], usage


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_thinking_token_budget_with_the_markers_of_the_reasoning_parser(server, stream):
    """--reasoning-parser qwen3 gives the engine its markers (as vLLM's derived --reasoning-config): a prompt
    that opens <think> gets exactly the budget's tokens of reasoning, then </think>, streamed or not."""
    def ids(text):
        return httpx.post(server.url + "/tokenize", json={"model": "demo", "prompt": text,
                                                           "add_special_tokens": False}).json()["tokens"]
    start, end = ids("<think>"), ids("</think>")
    prompt = ids("Question: what is 1+1?\nAnswer: ") + start
    for budget in (2, 6):
        body = {"model": "demo", "prompt": prompt, "max_tokens": 30, "temperature": 0, "return_token_ids": True,
                "thinking_token_budget": budget, "stream": stream}
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        if stream:
            chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
            out = [t for c in chunks for ch in c["choices"] for t in ch.get("token_ids") or []]
        else:
            out = r.json()["choices"][0]["token_ids"]
        n = len(end)
        first_end = next(j for j in range(len(out) - n + 1) if out[j:j + n] == end)
        assert first_end == budget, (budget, out)
    r = httpx.post(server.url + "/v1/completions", timeout=30, json={
        "model": "demo", "prompt": "x", "max_tokens": 2, "thinking_token_budget": -3})
    assert r.status_code == 400 and r.json()["error"]["param"] == "thinking_token_budget", r.text


def test_an_assistant_messages_reasoning_content_is_read_as_reasoning(server):
    """vLLM 0.33 renames the deprecated ``reasoning_content`` of a message to ``reasoning`` for the template."""
    template = ("{%- for m in messages %}{{- m['role'] + ':' + (m['reasoning'] if m['reasoning'] is defined else '-')"
                " + '|' }}{%- endfor %}")
    messages = [{"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello", "reasoning_content": "greet back"},
                {"role": "user", "content": "Bye"}]
    r = httpx.post(server.url + "/tokenize", json={"model": "demo", "messages": messages, "chat_template": template})
    text = httpx.post(server.url + "/detokenize", json={"model": "demo", "tokens": r.json()["tokens"]}).json()["prompt"]
    assert text == "user:-|assistant:greet back|user:-|", text


def test_tool_history_renders_through_the_template(server):
    messages = [{"role": "user", "content": "Weather in Oslo?"},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                    "name": "get_weather", "arguments": '{"city": "Oslo", "unit": "celsius"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "-3 degrees"}]
    r = httpx.post(server.url + "/tokenize", json={"model": "demo", "messages": messages, "tools": [WEATHER]}).json()
    text = httpx.post(server.url + "/detokenize", json={"model": "demo", "tokens": r["tokens"]}).json()["prompt"]
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}\n</tool_call>' in text
    assert "<tool_response>\n-3 degrees\n</tool_response>" in text
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in text
    msg, _ = chat(server, False, messages=messages, tools=[WEATHER], tool_choice="none", max_tokens=8)
    assert msg["tool_calls"] is None and isinstance(msg["content"], str)  # no calls: the field is left out, as vLLM


def test_a_tool_call_with_empty_arguments_renders_as_no_arguments(server):
    """A client may send a call of a tool without parameters with ``arguments: ""`` (vLLM's tests do): ``{}``."""
    messages = [{"role": "user", "content": "Time?"},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                    "name": "clock", "arguments": ""}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "noon"}]
    r = httpx.post(server.url + "/tokenize", json={"model": "demo", "messages": messages})
    assert r.status_code == 200, r.text
    text = httpx.post(server.url + "/detokenize", json={"model": "demo", "tokens": r.json()["tokens"]}).json()["prompt"]
    assert '<tool_call>\n{"name": "clock", "arguments": {}}\n</tool_call>' in text
    messages[1]["tool_calls"][0]["function"]["arguments"] = "{not json"
    r = httpx.post(server.url + "/tokenize", json={"model": "demo", "messages": messages})
    assert r.status_code == 400 and "arguments must be JSON text" in r.text, r.text


def test_without_thinking_there_is_no_reasoning(server):
    template = ("{%- for m in messages %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
                "{%- endfor %}{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking is defined and not "
                "enable_thinking %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}")
    kw = {"chat_template": template, "chat_template_kwargs": {"enable_thinking": False}}
    r = httpx.post(server.url + "/tokenize", json={"model": "demo", "messages": USER, **kw}).json()
    prompt = httpx.post(server.url + "/detokenize", json={"model": "demo", "tokens": r["tokens"]}).json()["prompt"]
    assert prompt.endswith("<think>\n\n</think>\n\n")
    msg, _ = chat(server, False, max_tokens=12, extra_body=kw)
    assert msg["reasoning"] is None and msg["content"]


@pytest.mark.parametrize("body, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nosuch"}}}},
     "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
    ({"structured_outputs": {"regex": "[a-"}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
    ({"structured_outputs": {"grammar": "start: nothing_here"}}, "structured_outputs"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nosuch"}}}],
      "tool_choice": "required"}, "tool_choice"),
])
def test_an_invalid_constraint_is_a_400_naming_the_field(server, body, param):
    r = httpx.post(server.url + "/v1/chat/completions", json={"model": "demo", "messages": USER, **body}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param, err
    assert httpx.get(server.url + "/health").status_code == 200


# a template that leaves the model thinking (``<think>\n``), or closes the block when thinking is off
THINK_TEMPLATE = ("{%- for m in messages %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
                  "{%- endfor %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- if enable_thinking is defined and not "
                  "enable_thinking %}{{- '\\n</think>\\n\\n' }}{%- endif %}")
FORCED = {"required": {"tools": [WEATHER, SEARCH], "tool_choice": "required"},
          "named": {"tools": [WEATHER, SEARCH], "tool_choice": {"type": "function", "function": {"name": "search"}}},
          "response_format": {"response_format": {"type": "json_schema", "json_schema": {
              "name": "point", "schema": SCHEMAS["point"]}}}}


def _chat_with_usage(server, stream: bool, **kw):
    """(message dict, finish_reason, usage) of one chat completion, a stream put back together."""
    kw = {"model": "demo", "messages": USER, "temperature": 0, "max_tokens": 120, **kw}
    if not stream:
        r = server.client.chat.completions.create(**kw)
        return r.choices[0].message.model_dump(), r.choices[0].finish_reason, r.usage
    usage = None
    chunks = list(server.client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    usage = chunks[-1].usage
    content, reasoning, calls, finish = "", "", {}, None
    for chunk in chunks:
        for c in chunk.choices:
            content += c.delta.content or ""
            reasoning += getattr(c.delta, "reasoning", None) or ""
            for tc in c.delta.tool_calls or []:
                call = calls.setdefault(tc.index, {"name": None, "arguments": ""})
                call["name"] = call["name"] or tc.function.name
                call["arguments"] += tc.function.arguments or ""
            finish = c.finish_reason or finish
    calls = [{"function": c} for _, c in sorted(calls.items())]
    return {"content": content or None, "reasoning": reasoning or None, "tool_calls": calls}, finish, usage


def _check_forced(kind: str, msg: dict, finish: str) -> None:
    if kind == "response_format":
        assert finish == "stop" and not msg["tool_calls"], msg
        jsonschema.validate(json.loads(msg["content"]), SCHEMAS["point"])
        return
    assert finish == "tool_calls" and msg["content"] is None and msg["tool_calls"], msg
    for call in msg["tool_calls"]:
        name = call["function"]["name"]
        assert kind == "required" or name == "search", msg
        jsonschema.validate(json.loads(call["function"]["arguments"]), TOOL_PARAMS[name])


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("kind", list(FORCED))
def test_a_thinking_model_reasons_before_a_forced_call_or_format(server, stream, kind):
    """As vLLM with a reasoning parser: the grammar of a forced call or a response_format starts after
    ``</think>`` (here forced by thinking_token_budget, the demo model does not think by itself); the reasoning is
    split off first, the call or the content read from the rest, and reasoning_tokens counts the reasoning."""
    for budget in (3, 8):
        msg, finish, usage = _chat_with_usage(server, stream, **FORCED[kind], extra_body={
            "chat_template": THINK_TEMPLATE, "thinking_token_budget": budget})
        assert msg["reasoning"] and "think>" not in msg["reasoning"], msg
        _check_forced(kind, msg, finish)
        n = usage.completion_tokens_details.reasoning_tokens
        assert 0 < n <= budget < usage.completion_tokens, usage


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("kind", list(FORCED))
def test_with_thinking_off_the_grammar_starts_at_the_first_token(server, stream, kind):
    msg, finish, usage = _chat_with_usage(server, stream, **FORCED[kind], extra_body={
        "chat_template": THINK_TEMPLATE, "chat_template_kwargs": {"enable_thinking": False}})
    assert msg["reasoning"] is None, msg
    _check_forced(kind, msg, finish)
    assert usage.completion_tokens_details.reasoning_tokens == 0, usage


def test_a_forced_call_whose_reasoning_is_cut_short_has_no_call(server):
    msg, finish, _ = _chat_with_usage(server, False, **FORCED["named"], max_tokens=6, extra_body={
        "chat_template": THINK_TEMPLATE, "thinking_token_budget": 50})
    assert finish == "length" and msg["reasoning"] and not msg["tool_calls"] and msg["content"] is None, msg
