"""The server under abuse: API keys, request caps, body size, slow clients, admission control (429), text
that is not Unicode, wrong types and huge numbers. Every answer is checked for its exact status and
OpenAI's error shape; none may be a 5xx."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import openai
import pytest

from minivllm import LLM, SamplingParams
from tests.helpers.server_utils import running_server

pytestmark = pytest.mark.server
KEYS = ("key-one", "key-two")
ENV_KEY = "key-three"
LIMITS = ["--max-num-seqs", "1", "--max-num-waiting", "4", "--max-n", "4", "--max-logprobs", "3",
          "--max-stop-strings", "2", "--max-stop-string-chars", "8", "--max-body-bytes", "65536",
          "--request-timeout-s", "1"]
ARGS = ["--device", "cpu", "--max-model-len", "256", "--num-kvcache-blocks", "64", "--served-model-name", "tiny",
        "--api-key", KEYS[0], "--api-key", KEYS[1], *LIMITS]
AUTH = {"Authorization": f"Bearer {KEYS[0]}"}


@pytest.fixture(scope="module")
def server(tiny_tied_model, tmp_path_factory):
    with running_server(tiny_tied_model, ARGS, tmp_path_factory.mktemp("guarded"),
                        env={"MINIVLLM_API_KEY": f" {ENV_KEY} ,"}, api_key=KEYS[0]) as srv:
        yield srv


def _error(r: httpx.Response, status: int, param: str | None = "any", code: str | None = "any") -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param != "any":
        assert err["param"] == param, err
    if code != "any":
        assert err["code"] == code, err
    return err


def _post(server, path: str, body, headers=AUTH, **kw) -> httpx.Response:
    if not isinstance(body, (dict, list)):  # raw JSON text, bytes, or a generator of bytes
        return httpx.post(server.url + path, content=body, headers={**headers, "content-type": "application/json"},
                          timeout=30, **kw)
    return httpx.post(server.url + path, json=body, headers=headers, timeout=30, **kw)


def test_api_keys(server):
    url = server.url
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {KEYS[0]}"},
                    {"Authorization": f"Bearer {KEYS[0]}x"}):
        for method, path in (("GET", "/v1/models"), ("POST", "/v1/completions"), ("POST", "/tokenize"),
                             ("POST", "/detokenize"), ("POST", "/v1/chat/completions"),
                             ("POST", "/v1/chat/completions/batch"), ("POST", "/invocations")):
            r = httpx.request(method, url + path, headers=headers, json={"prompt": "x"}, timeout=10)
            _error(r, 401, None, "invalid_api_key")
            assert r.headers["www-authenticate"] == "Bearer"
    for key in (*KEYS, ENV_KEY):
        assert httpx.get(url + "/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 200
    assert httpx.get(url + "/health").status_code == 200 and httpx.get(url + "/metrics").status_code == 200
    assert httpx.get(url + "/ping").status_code == 200 and httpx.get(url + "/load").json() == {"server_load": 0}
    out = server.client.completions.create(model="tiny", prompt="def f(", max_tokens=3)
    assert len(out.choices[0].text) > 0
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).models.list()


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", {"prompt": "x", "n": 5}, "n"),
    ("/v1/completions", {"prompt": "x", "n": 1000}, "n"),
    ("/v1/completions", {"prompt": "x", "n": 0}, "n"),
    ("/v1/completions", {"prompt": "x", "best_of": 9}, "best_of"),
    ("/v1/completions", {"prompt": "x", "n": 2, "best_of": 1}, "best_of"),
    ("/v1/completions", {"prompt": "x", "n": 1, "best_of": 2}, "best_of"),
    ("/v1/completions", {"prompt": "x", "logprobs": 4}, "logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": True,
                              "top_logprobs": 4}, "top_logprobs"),
    ("/v1/completions", {"prompt": "x", "stop": ["a", "b", "c"]}, "stop"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "stop": "123456789"}, "stop"),
    # NOTE: a template is code the server runs: refused without --trust-request-chat-template
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "chat_template": "{{ 1 }}"},
     "chat_template"),
])
def test_request_caps(server, path, body, param):
    for stream in (False, True):
        _error(_post(server, path, {**body, "stream": stream}), 400, param)


def test_tokenize_refuses_a_request_chat_template_too(server):
    body = {"messages": [{"role": "user", "content": "x"}], "chat_template": "{{ 1 }}"}
    _error(_post(server, "/tokenize", body), 400, "chat_template")


def test_best_of_equal_to_n_is_accepted(server):
    r = _post(server, "/v1/completions", {"prompt": "x", "n": 2, "best_of": 2, "max_tokens": 2})
    assert r.status_code == 200 and len(r.json()["choices"]) == 2


def test_bodies_over_the_cap_get_413_unread(server):
    # NOTE: a Content-Length far over the cap, and no body at all: a 413 shows that the server did not wait for
    # (read) the body; waiting, it would have closed the connection at the 1 s request timeout, without an answer
    with socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1])), timeout=5) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                  b"authorization: Bearer key-one\r\ncontent-length: 10000000\r\n\r\n")
        got = s.recv(65536)
        assert got.startswith(b"HTTP/1.1 413 "), got
        while chunk := s.recv(65536):  # NOTE: the server closes the connection (the body was never read)
            got += chunk
        assert json.loads(got.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_too_large"
    big = json.dumps({"prompt": "x" * 70000, "max_tokens": 1}).encode()
    _error(_post(server, "/v1/completions", big), 413, None, "request_too_large")

    def chunks():  # NOTE: a generator body goes out chunked, with no Content-Length
        for i in range(0, len(big), 4096):
            yield big[i:i + 4096]

    _error(_post(server, "/v1/completions", chunks()), 413)
    assert httpx.get(server.url + "/health").status_code == 200


def _closed_within(port: int, data: bytes, seconds: float) -> tuple[bytes, float]:
    """Send ``data`` and wait for the server to close the connection; returns what it sent and how long."""
    with socket.create_connection(("127.0.0.1", port), timeout=seconds + 5) as s:
        t0 = time.monotonic()
        if data:
            s.sendall(data)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
        return got, time.monotonic() - t0


def test_slow_clients_are_closed(server):
    port = int(server.url.rsplit(":", 1)[1])
    cases = {
        "nothing sent": b"",
        "half the headers": b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: appl",
        "half the body": b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer key-one\r\n"
                         b"content-type: application/json\r\ncontent-length: 100\r\n\r\n{\"prompt\": ",
    }
    results = {}
    threads = [threading.Thread(target=lambda k=k, d=d: results.__setitem__(k, _closed_within(port, d, 1.0)))
               for k, d in cases.items()]
    for t in threads:
        t.start()
    small = _post(server, "/v1/completions", {"prompt": "x", "max_tokens": 1})  # meanwhile, others are served
    for t in threads:
        t.join(10)
    assert small.status_code == 200
    for name, (got, seconds) in results.items():
        assert seconds > 0.9, (name, seconds)  # not before the 1 s request timeout (closed: recv returned)
        if name != "half the body":  # NOTE: no request yet: the server answers 408 before closing
            assert got.startswith(b"HTTP/1.1 408 "), (name, got)
            assert json.loads(got.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_timeout"


def _rejections(server) -> dict[str, float]:
    """``vllm:admission_rejections_total`` by reason, from /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    families = text_string_to_metric_families(httpx.get(server.url + "/metrics").text)
    return {s.labels["reason"]: s.value for f in families if f.name == "vllm:admission_rejections"
            for s in f.samples if s.name.endswith("_total")}


def test_too_many_waiting_get_429_with_retry_after(server):
    """One sequence runs (max_num_seqs 1), four may wait (max_num_waiting 4): the next one gets 429, counted in
    vLLM's vllm:admission_rejections_total{reason="max_num_queued_reqs"}."""
    server.wait_idle()
    before = _rejections(server)
    assert set(before) == {"max_num_queued_reqs", "max_num_queued_tokens"}, before
    long = {"prompt": "x", "max_tokens": 200, "ignore_eos": True, "stream": True}
    with httpx.Client(headers=AUTH, timeout=30) as c:
        streams = [c.stream("POST", server.url + "/v1/completions", json=long) for _ in range(5)]
        try:
            for s in streams:
                assert s.__enter__().status_code == 200
            r = _post(server, "/v1/completions", {"prompt": "x", "max_tokens": 1})
            _error(r, 429, None, "too_many_waiting_requests")
            assert r.headers["retry-after"] == "1"
            _error(_post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}), 429)
            after = _rejections(server)
            assert after["max_num_queued_reqs"] == before["max_num_queued_reqs"] + 2, after
            assert after["max_num_queued_tokens"] == before["max_num_queued_tokens"], after
        finally:
            for s in streams:
                s.__exit__(None, None, None)
    server.wait_idle()
    assert _post(server, "/v1/completions", {"prompt": "x", "max_tokens": 1}).status_code == 200


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", '{"prompt": "ab\\ud800c"}', "prompt"),
    ("/v1/completions", '{"prompt": ["ok", "\\udfff"]}', "prompt.1"),
    ("/v1/completions", '{"prompt": "x", "stop": ["\\ud800"]}', "stop.0"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "\\ud800"}]}', "messages.0.content"),
    ("/v1/chat/completions", '{"messages": [{"role": "\\ud800", "content": "x"}]}', "messages.0.role"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud800"}]}]}',
     "messages.0.content.0.text"),
    ("/tokenize", '{"prompt": "\\ud800"}', "prompt"),
])
def test_text_that_is_not_unicode_gets_400_naming_the_field(server, path, body, param):
    _error(_post(server, path, body), 400, param)


@pytest.mark.parametrize("body", [
    '{"prompt": "x", "temperature": "hot"}', '{"prompt": "x", "n": "many"}', '{"prompt": "x", "n": 2.5}',
    '{"prompt": "x", "temperature": NaN}', '{"prompt": "x", "presence_penalty": Infinity}',
    '{"prompt": "x", "top_p": -Infinity}', '{"prompt": "x", "max_tokens": 1180591620717411303424}',
    '{"prompt": "x", "min_tokens": 1180591620717411303424}', '{"prompt": [1180591620717411303424]}',
    '{"prompt": "x", "logprobs": -1}', '{"prompt": "x", "stop": 7}', '{"prompt": "x", "stop_token_ids": "a"}',
    '{"prompt": "x", "max_tokens": -5}', '{"prompt": [[]]}', '{"prompt": []}', '{"prompt": null}', '[1, 2]',
    '{"prompt": "x", "stream_options": 3}', '{"prompt": "x", "seed": "s"}', '"just a string"', '{}', '',
    '{"prompt": "x", "stop_token_ids": [1180591620717411303424]}',
])
def test_wrong_types_and_out_of_range_values_get_400(server, body):
    _error(_post(server, "/v1/completions", body), 400)


@pytest.mark.parametrize("seed, kind", [(2**63, "less_than_equal"), (-(2**63) - 1, "greater_than_equal")])
def test_a_seed_outside_int64_is_a_400_with_pydantics_error_type(server, seed, kind):
    """vLLM's message carries the validation error's type, which clients (and vLLM's tests) match on."""
    err = _error(_post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                         "seed": seed}), 400, "seed")
    assert f"[type={kind}]" in err["message"], err


@pytest.mark.parametrize("extra", [{"top_k": 2**70}, {"temperature": 1e308}])
def test_huge_but_valid_values_are_served(server, extra):
    r = _post(server, "/v1/completions", {"prompt": "x", "max_tokens": 2, **extra})
    assert r.status_code == 200, r.text


def test_python_api_names_the_parameter(tiny_tied_model):
    with pytest.raises(ValueError, match="temperature must be a float, got 'hot'"):
        SamplingParams(temperature="hot")
    with LLM(tiny_tied_model, device="cpu", max_model_len=64, num_kvcache_blocks=8) as llm:
        with pytest.raises(ValueError, match="^prompt is not valid Unicode"):
            llm.generate(["fine", "bad \ud800"], SamplingParams(max_tokens=2), use_tqdm=False)
        assert llm.generate("fine", SamplingParams(max_tokens=2), use_tqdm=False)[0]["token_ids"]


def test_the_key_guards_the_routes_under_the_root_path_too():
    """With --root-path /llm the routes answer at /llm/v1/... as at /v1/... (as vLLM): the key check must see
    the route's path, or /llm/v1/... would pass unchecked."""
    import asyncio

    from minivllm.entrypoints.openai.guards import RequestGuard, route_path

    assert route_path({"path": "/llm/v1/models", "root_path": "/llm"}) == "/v1/models"
    assert route_path({"path": "/v1/models", "root_path": "/llm"}) == "/v1/models"
    assert route_path({"path": "/llmx/v1/models", "root_path": "/llm"}) == "/llmx/v1/models"
    assert route_path({"path": "/v1/models"}) == "/v1/models"

    async def call(path: str, headers: list) -> int:
        sent, reached = [], []

        async def app(scope, receive, send):
            reached.append(scope["path"])

        async def send(message):
            sent.append(message)

        guard = RequestGuard(app, ["k"], 1024)
        await guard({"type": "http", "path": path, "root_path": "/llm", "headers": headers}, None, send)
        return sent[0]["status"] if sent else 200

    for path in ("/v1/models", "/llm/v1/models", "/llm/tokenize"):
        assert asyncio.run(call(path, [])) == 401, path
        assert asyncio.run(call(path, [(b"authorization", b"Bearer k")])) == 200, path
    assert asyncio.run(call("/llm/health", [])) == 200
