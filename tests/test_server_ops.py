"""vLLM's operational behaviours over HTTP, against ``minivllm serve`` of the demo model on a Unix domain socket
(``--uds``): ``--enable-force-include-usage``, ``--enable-server-load-tracking`` with ``GET /load``, the batch chat
route, SageMaker's ``/invocations`` and ``/ping``, the ORCA ``endpoint-load-metrics`` header, and the metrics
vLLM's own tests read (``vllm:iteration_tokens_total``, ``vllm:num_requests_waiting_by_reason``, the counters of an
aborted request)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.server_utils import ROOT

pytestmark = [pytest.mark.server,
              pytest.mark.skipif(not (ROOT / "models" / "minivllm-demo-py").is_dir(), reason="no demo model")]
DEMO = str(ROOT / "models" / "minivllm-demo-py")
NAME = "demo"
ARGS = ["--served-model-name", NAME, "--device", "cpu", "--max-model-len", "512", "--enable-force-include-usage",
        "--enable-server-load-tracking"]
USER = [{"role": "user", "content": "What does `bisect.insort` do?"}]
CONVERSATIONS = [USER, [{"role": "user", "content": "What does `os.path.join` do?"}],
                 [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is `zip`?"}]]


@contextlib.contextmanager
def uds_server(args: list[str], log_path):
    """``minivllm serve DEMO *args --uds SOCKET``; yields an httpx client on that socket once it is healthy."""
    folder = tempfile.mkdtemp(prefix="minivllm-")  # short: a socket's path has ~100 bytes at most
    sock = os.path.join(folder, "serve.sock")
    log = open(log_path, "w+")
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "minivllm.entrypoints.cli", "serve", DEMO, *args, "--uds", sock],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    client = httpx.Client(transport=httpx.HTTPTransport(uds=sock), base_url="http://minivllm", timeout=60)
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, f"server exited early:\n{log.seek(0) or log.read()}"
            assert time.monotonic() < deadline, f"server not healthy in time:\n{log.seek(0) or log.read()}"
            try:
                if client.get("/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        client.sock = sock
        yield client
    finally:
        client.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def http(tmp_path_factory):
    with uds_server(ARGS, tmp_path_factory.mktemp("ops") / "server.log") as client:
        yield client


@pytest.fixture(scope="module")
def oai(http):
    client = openai.OpenAI(base_url="http://minivllm/v1", api_key="none", max_retries=0,
                           http_client=httpx.Client(transport=httpx.HTTPTransport(uds=http.sock), timeout=60))
    yield client
    client.close()


def metrics(http) -> dict[str, float]:
    """``name{labels but model_name}`` -> value, as ``tests/helpers/server_utils.py`` reads them."""
    return {s.name + json.dumps(dict(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))): s.value
            for f in text_string_to_metric_families(http.get("/metrics").text) for s in f.samples}


def wait_idle(http) -> dict[str, float]:
    deadline = time.monotonic() + 20
    while True:
        m = metrics(http)
        if (m["vllm:num_requests_running{}"] == 0 and m["vllm:num_requests_waiting{}"] == 0
                and m["minivllm_kv_cache_blocks_used{}"] == 0):
            return m
        assert time.monotonic() < deadline, f"server not idle: {m}"
        time.sleep(0.05)


def settle(http) -> dict[str, float]:
    """The metrics once the engine has run every command sent before this (a request sent after them finished:
    the engine takes them in order) and is idle, so that no earlier request's abort lands in a later delta."""
    http.post("/v1/completions", json={"model": NAME, "prompt": "x", "max_tokens": 1})
    return wait_idle(http)


def sse(response: httpx.Response) -> list[dict]:
    lines = [ln.removeprefix("data: ") for ln in response.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(ln) for ln in lines[:-1]]


def error_of(r: httpx.Response, status: int = 400) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


# ------------------------------------------------------------------ --uds
def test_the_server_answers_on_its_unix_socket(http):
    assert os.path.exists(http.sock)
    from minivllm import __version__

    assert http.get("/version").json() == {"version": __version__}
    assert http.get("/v1/models").json()["data"][0]["id"] == NAME


def test_uds_serves_one_engine_only():
    """Ray Serve's proxy serves replicas on --host/--port: --uds with replicas is refused before Ray starts."""
    from minivllm.config.server import ServerConfig
    from minivllm.scale_out.serve.app import build_serve_app

    with pytest.raises(ValueError, match="uds"):
        build_serve_app(DEMO, {"data_parallel_size": 2, "device": "cpu"}, ServerConfig(uds="/tmp/x.sock"))
    with pytest.raises(ValueError, match="uds must be a socket path"):
        ServerConfig(uds="")


# ------------------------------------------------------------------ --enable-force-include-usage
@pytest.mark.parametrize("path, body", [("/v1/completions", {"prompt": "def f(x):"}),
                                        ("/v1/chat/completions", {"messages": USER})])
def test_forced_usage_is_in_every_chunk_and_a_last_one(http, path, body):
    body = {"model": NAME, **body, "max_tokens": 6, "temperature": 0, "ignore_eos": True, "stream": True}
    with http.stream("POST", path, json=body) as r:  # no stream_options: the server adds usage anyway
        assert r.status_code == 200
        events = sse(r)
    *chunks, last = events
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 6
    assert all(e["usage"] is not None for e in chunks)
    counts = [e["usage"]["completion_tokens"] for e in chunks]
    assert counts == sorted(counts) and counts[-1] == 6
    assert all(e["usage"]["total_tokens"] == e["usage"]["prompt_tokens"] + e["usage"]["completion_tokens"]
               for e in events)
    # as asked explicitly, include_usage alone: still in every chunk (vLLM's flag forces both)
    with http.stream("POST", path, json={**body, "stream_options": {"include_usage": True}}) as r:
        assert all(e["usage"] is not None for e in sse(r))
    whole = http.post(path, json={**body, "stream": False}).json()
    assert whole["usage"]["completion_tokens"] == 6 and whole["usage"]["prompt_tokens_details"] is None


def test_prompt_tokens_details_are_null_without_the_flag(http):
    """vLLM's default: no --enable-prompt-tokens-details, no prompt_tokens_details, even on a prefix-cache hit."""
    body = {"model": NAME, "prompt": [300 + i for i in range(70)], "max_tokens": 1}
    for _ in range(2):
        assert http.post("/v1/completions", json=body).json()["usage"]["prompt_tokens_details"] is None
    with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        assert all(e["usage"]["prompt_tokens_details"] is None for e in sse(r))
    assert metrics(http)["vllm:prefix_cache_hits_total{}"] > 0  # the engine did read the cache


def test_forced_usage_through_the_openai_client(oai):
    chunks = list(oai.chat.completions.create(model=NAME, messages=USER, max_tokens=5, temperature=0, stream=True,
                                              extra_body={"min_tokens": 5}))
    assert all(c.usage is not None for c in chunks) and chunks[-1].usage.completion_tokens == 5


# ------------------------------------------------------------------ --enable-server-load-tracking, GET /load
def test_load_counts_the_generating_requests_in_flight(http):
    assert http.get("/load").json() == {"server_load": 0}
    body = {"model": NAME, "prompt": "def g(", "max_tokens": 400, "ignore_eos": True, "stream": True}
    with http.stream("POST", "/v1/completions", json=body) as a, \
            http.stream("POST", "/v1/chat/completions", json={**body, "prompt": None, "messages": USER}) as b:
        assert a.status_code == b.status_code == 200
        lines_a, lines_b = a.iter_lines(), b.iter_lines()  # NOTE: held: a dropped iterator closes its connection
        next(ln for ln in lines_a if ln.startswith("data: "))
        next(ln for ln in lines_b if ln.startswith("data: "))
        assert http.get("/load").json() == {"server_load": 2}
        http.get("/metrics")
        http.post("/tokenize", json={"prompt": "x"})
        assert http.get("/load").json() == {"server_load": 2}  # other routes are not counted
    deadline = time.monotonic() + 10  # the server sees the disconnects
    while http.get("/load").json()["server_load"] != 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert http.post("/v1/completions", json={"model": NAME, "prompt": "x", "temperature": -1}).status_code == 400
    http.post("/v1/completions", json={"model": NAME, "prompt": "x", "max_tokens": 2})
    assert http.get("/load").json() == {"server_load": 0}
    wait_idle(http)


# ------------------------------------------------------------------ the ORCA load report header
ORCA_TEXT = re.compile(r"^TEXT named_metrics\.kv_cache_usage_perc=[0-9.e-]+, named_metrics\.num_requests_waiting=[0-9.]+$")


def test_orca_header_when_asked_in_text_or_json(http):
    body = {"model": NAME, "prompt": "x", "max_tokens": 2}
    r = http.post("/v1/completions", json=body, headers={"endpoint-load-metrics-format": "TEXT"})
    assert ORCA_TEXT.match(r.headers["endpoint-load-metrics"]), r.headers["endpoint-load-metrics"]
    r = http.post("/v1/chat/completions", json={**body, "prompt": None, "messages": USER},
                  headers={"endpoint-load-metrics-format": "json"})
    kind, _, report = r.headers["endpoint-load-metrics"].partition(" ")
    named = json.loads(report)["named_metrics"]
    assert kind == "JSON" and set(named) == {"kv_cache_usage_perc", "num_requests_waiting"}
    assert 0 <= named["kv_cache_usage_perc"] <= 1 and named["num_requests_waiting"] >= 0
    r = http.post("/invocations", json=body, headers={"endpoint-load-metrics-format": "TEXT"})
    assert ORCA_TEXT.match(r.headers["endpoint-load-metrics"])
    assert "endpoint-load-metrics" not in http.post("/v1/completions", json=body).headers  # not asked
    r = http.post("/v1/completions", json=body, headers={"endpoint-load-metrics-format": "XML"})
    assert r.status_code == 200 and "endpoint-load-metrics" not in r.headers  # a format vLLM does not know
    with http.stream("POST", "/v1/completions", json={**body, "stream": True},
                     headers={"endpoint-load-metrics-format": "TEXT"}) as r:
        assert "endpoint-load-metrics" not in r.headers and sse(r)  # streams carry none, as in vLLM
    r = http.post("/v1/completions", json={**body, "temperature": -1}, headers={"endpoint-load-metrics-format": "TEXT"})
    assert r.status_code == 400 and "endpoint-load-metrics" not in r.headers


def test_orca_header_through_the_openai_client(oai):
    raw = oai.completions.with_raw_response.create(model=NAME, prompt="x", max_tokens=2,
                                                   extra_headers={"endpoint-load-metrics-format": "TEXT"})
    assert ORCA_TEXT.match(raw.headers["endpoint-load-metrics"]) and raw.parse().choices[0].text is not None


# ------------------------------------------------------------------ metrics that vLLM's tests read
def test_iteration_tokens_count_prompts_and_generated_tokens_per_step(http):
    """vLLM's expectation (its test_metrics_counts): sequential requests of P prompt tokens and T generated ones
    add N * (P + T) to the sum and N * T to the count (the first step carries the prompt)."""
    ids = http.post("/tokenize", json={"prompt": "Hello my name is Robert and I love magic"}).json()["tokens"]
    before = settle(http)
    for _ in range(3):
        http.post("/v1/completions", json={"model": NAME, "prompt": ids, "max_tokens": 5, "ignore_eos": True})
    after = wait_idle(http)
    delta = {k: after[k] - before.get(k, 0) for k in after}
    assert delta["vllm:iteration_tokens_total_sum{}"] == 3 * (len(ids) + 5)
    assert delta["vllm:iteration_tokens_total_count{}"] == 3 * 5
    assert delta["vllm:prompt_tokens_total{}"] == 3 * len(ids) and delta["vllm:generation_tokens_total{}"] == 15
    assert delta['vllm:request_success_total{"finished_reason": "length"}'] == 3
    buckets = sorted(float(k.split('"le": "')[1].split('"')[0]) for k in after
                     if k.startswith("vllm:iteration_tokens_total_bucket"))
    assert buckets == [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, float("inf")]


def test_waiting_by_reason_and_every_finish_reason_exist(http):
    m = wait_idle(http)
    assert m['vllm:num_requests_waiting_by_reason{"reason": "capacity"}'] == m["vllm:num_requests_waiting{}"] == 0
    assert m['vllm:num_requests_waiting_by_reason{"reason": "deferred"}'] == 0
    for reason in ("stop", "length", "abort", "error", "repetition"):
        assert f'vllm:request_success_total{{"finished_reason": "{reason}"}}' in m


def test_an_aborted_request_is_counted_as_vllm_counts_it(http):
    """What vLLM's test_abort_metrics_reset reads after an abort (running, waiting, KV cache usage back to 0),
    and the counters: the request ends as "abort", its prompt and the tokens it generated are counted."""
    prompt = http.post("/tokenize", json={"prompt": "def fibonacci(n):"}).json()["tokens"]
    before = settle(http)
    body = {"model": NAME, "prompt": prompt, "max_tokens": 400, "ignore_eos": True, "stream": True}
    received = 0
    with http.stream("POST", "/v1/completions", json={**body, "return_token_ids": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                received += sum(len(c["token_ids"]) for c in json.loads(line[6:])["choices"])
                if received >= 3:
                    break
    after = wait_idle(http)
    delta = {k: after[k] - before.get(k, 0) for k in after}
    assert after["vllm:kv_cache_usage_perc{}"] == 0
    assert delta['vllm:request_success_total{"finished_reason": "abort"}'] == 1
    assert sum(delta[f'vllm:request_success_total{{"finished_reason": "{r}"}}'] for r in ("stop", "length")) == 0
    assert delta["vllm:prompt_tokens_total{}"] == len(prompt)
    assert delta["vllm:generation_tokens_total{}"] >= received
    assert delta["vllm:time_to_first_token_seconds_count{}"] == 1
    assert http.get("/load").json() == {"server_load": 0}


# ------------------------------------------------------------------ POST /v1/chat/completions/batch
def test_batch_chat_answers_each_conversation_as_chat_would(http):
    kw = {"model": NAME, "max_tokens": 12, "temperature": 0, "return_token_ids": True}
    out = http.post("/v1/chat/completions/batch", json={**kw, "messages": CONVERSATIONS})
    assert out.status_code == 200, out.text
    out = out.json()
    assert out["object"] == "chat.completion" and out["id"].startswith("chatcmpl-") and out["model"] == NAME
    singles = [http.post("/v1/chat/completions", json={**kw, "messages": c}).json() for c in CONVERSATIONS]
    assert [c["index"] for c in out["choices"]] == [0, 1, 2]
    for choice, single in zip(out["choices"], singles):
        assert choice["message"] == single["choices"][0]["message"] and choice["message"]["content"]
        assert choice["token_ids"] == single["choices"][0]["token_ids"]
        assert choice["finish_reason"] == single["choices"][0]["finish_reason"]
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert out["usage"][key] == sum(s["usage"][key] for s in singles)
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    out = http.post("/v1/chat/completions/batch", json={**kw, "max_tokens": 30, "messages": CONVERSATIONS[:2],
                                                        "response_format": fmt}).json()
    assert [json.loads(c["message"]["content"])["answer"] in ("yes", "no") for c in out["choices"]] == [True, True]


@pytest.mark.parametrize("body, param", [
    ({"stream": True}, "stream"), ({"n": 2}, "n"), ({"messages": []}, "messages"),
    ({"messages": [USER, []]}, "messages"), ({"messages": USER}, "messages.0"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"), ({"tool_choice": "required"}, "tool_choice"),
    ({"temperature": "hot"}, "temperature"),
    ({"messages": [USER, [{"role": "user", "content": "x" * 3000}]]}, None),  # chat's own 400: too long
])
def test_a_batch_it_cannot_run_gets_a_400_naming_the_field(http, body, param):
    err = error_of(http.post("/v1/chat/completions/batch", json={"model": NAME, "messages": CONVERSATIONS, **body}))
    assert err["param"] == param, err
    assert error_of(http.post("/v1/chat/completions/batch", json={"model": "nope", "messages": CONVERSATIONS}),
                    404)["code"] == "model_not_found"
    wait_idle(http)  # a refused batch leaves nothing running


def test_a_batch_whose_client_goes_away_aborts_every_conversation(http):
    before = settle(http)
    body = json.dumps({"model": NAME, "messages": CONVERSATIONS, "max_tokens": 400, "ignore_eos": True}).encode()
    with socket.socket(socket.AF_UNIX) as raw:
        raw.connect(http.sock)
        raw.sendall(b"POST /v1/chat/completions/batch HTTP/1.1\r\nHost: minivllm\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        deadline = time.monotonic() + 20
        while metrics(http)["vllm:num_requests_running{}"] < len(CONVERSATIONS):
            assert time.monotonic() < deadline
            time.sleep(0.05)
    after = wait_idle(http)
    aborted = 'vllm:request_success_total{"finished_reason": "abort"}'
    assert after[aborted] - before[aborted] == len(CONVERSATIONS)


# ------------------------------------------------------------------ SageMaker: POST /invocations, /ping
def test_invocations_routes_chat_and_completion_bodies(http):
    chat = http.post("/invocations", json={"model": NAME, "messages": USER, "max_tokens": 8, "temperature": 0})
    assert chat.status_code == 200 and chat.json()["object"] == "chat.completion"
    assert chat.json()["choices"][0]["message"]["content"] == http.post("/v1/chat/completions", json={
        "model": NAME, "messages": USER, "max_tokens": 8, "temperature": 0}).json()["choices"][0]["message"]["content"]
    text = http.post("/invocations", json={"prompt": "def f(x):", "max_tokens": 4, "temperature": 0})
    assert text.status_code == 200 and text.json()["object"] == "text_completion"
    with http.stream("POST", "/invocations", json={"prompt": "def f(x):", "max_tokens": 4, "stream": True}) as r:
        assert r.headers["content-type"].startswith("text/event-stream") and sse(r)[0]["object"] == "text_completion"
    for method in ("GET", "POST"):
        assert http.request(method, "/ping").status_code == 200
    doc = http.get("/openapi.json").json()
    assert {"/invocations", "/v1/chat/completions/batch", "/load", "/ping"} <= set(doc["paths"])
    assert {"BatchChatCompletionRequest", "ChatCompletionRequest", "CompletionRequest"} <= set(doc["components"]["schemas"])


@pytest.mark.parametrize("body, param, message", [
    # a body with no messages is a completion request (its prompt is optional there, for prompt_embeds, as vLLM)
    ({"model": NAME}, "prompt", "Either prompt or prompt_embeds must be provided and non-empty."),
    ([1, 2], None, "Cannot find suitable handler for request. Expected one of: ['ChatCompletionRequest', "
                   "'CompletionRequest']"),
    ({"messages": USER, "temperature": "hot"}, "temperature", None),  # meant as chat: chat's own 400
    ({"prompt": "x", "max_tokens": -1}, "max_tokens", None),
    ({"prompt": "x", "n": "two"}, "n", None),
])
def test_invocations_of_a_body_it_cannot_route_get_a_400(http, body, param, message):
    err = error_of(http.post("/invocations", json=body))
    assert err["param"] == param and (message is None or err["message"].startswith(message)), err
    err = error_of(http.post("/invocations", content=b'{"prompt": ', headers={"content-type": "application/json"}))
    assert "not valid JSON" in err["message"]
