"""The OpenAI-compatible server as a real process, driven by the official ``openai`` client."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import threading
import time

import httpx
import openai
import pytest

from tests.helpers.server_utils import running_server  # noqa: E402

pytestmark = pytest.mark.server
NAME = "tiny"
# NOTE: asynchronous scheduling as on a GPU (its default there): tokens reach requests one step late
ENGINE_ARGS = ["--device", "cpu", "--max-model-len", "512", "--num-kvcache-blocks", "256", "--async-scheduling"]


@pytest.fixture(scope="module")
def server(tiny_tied_model, tmp_path_factory):
    with running_server(tiny_tied_model, ["--served-model-name", NAME, *ENGINE_ARGS],
                        tmp_path_factory.mktemp("server")) as srv:
        yield srv


@pytest.fixture(scope="module")
def offline(tiny_tied_model):
    from minivllm import LLM

    with LLM(tiny_tied_model, device="cpu", max_model_len=512, num_kvcache_blocks=256) as llm:
        yield llm


def test_health_and_models(server):
    assert httpx.get(f"{server.url}/health").status_code == 200
    models = server.client.models.list().data
    assert [m.id for m in models] == [NAME] and models[0].max_model_len == 512


def test_greedy_completion_stream_equals_nonstream_equals_offline(server, offline):
    from minivllm import SamplingParams

    kw = dict(model=NAME, prompt="def f(x):", max_tokens=12, temperature=0)
    full = server.client.completions.create(**kw)
    chunks = list(server.client.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    ref = offline.generate("def f(x):", SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)[0]
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert full.choices[0].text == text == ref["text"]
    assert full.object == "text_completion" and full.id.startswith("cmpl-")
    assert full.choices[0].finish_reason == ref["finish_reason"] == [c for c in chunks if c.choices][-1].choices[0].finish_reason
    n_prompt = len(offline.get_tokenizer().encode("def f(x):"))
    assert (full.usage.prompt_tokens, full.usage.completion_tokens) == (n_prompt, len(ref["token_ids"]))
    assert chunks[-1].choices == [] and chunks[-1].usage == full.usage
    echo = server.client.completions.create(**kw, echo=True)
    assert echo.choices[0].text == "def f(x):" + text


def test_greedy_chat_stream_equals_nonstream_equals_offline(server, offline):
    from minivllm import SamplingParams

    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    kw = dict(model=NAME, messages=messages, max_tokens=10, temperature=0)
    full = server.client.chat.completions.create(**kw)
    chunks = list(server.client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    tok = offline.get_tokenizer()
    ids = tok.encode(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
                     add_special_tokens=False)
    ref = offline.generate(ids, SamplingParams(temperature=0, max_tokens=10), use_tqdm=False)[0]
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert full.choices[0].message.content == text == ref["text"]
    assert full.object == "chat.completion" and chunks[0].object == "chat.completion.chunk"
    assert full.usage.prompt_tokens == len(ids) and full.usage.completion_tokens == len(ref["token_ids"])
    assert chunks[-1].usage.total_tokens == full.usage.total_tokens


def test_n_and_prompt_lists_count_usage(server):
    extra = {"ignore_eos": True}
    out = server.client.completions.create(model=NAME, prompt=["a", "bb cc"], n=2, max_tokens=5, temperature=0.8,
                                           seed=1, extra_body=extra)
    assert sorted(c.index for c in out.choices) == [0, 1, 2, 3]
    assert out.usage.completion_tokens == 20 and out.usage.total_tokens == out.usage.prompt_tokens + 20
    chat = server.client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}], n=2,
                                                 max_tokens=4, stream=True, stream_options={"include_usage": True},
                                                 extra_body=extra)
    chunks = list(chat)
    texts = {0: "", 1: ""}
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] += ch.delta.content or ""
    assert {c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason} == {"length"}
    assert chunks[-1].usage.completion_tokens == 8 and all(texts.values())
    lp = server.client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=3, logprobs=True, top_logprobs=2, extra_body=extra)
    assert len(lp.choices[0].logprobs.content) == 3 and len(lp.choices[0].logprobs.content[0].top_logprobs) == 2


def test_concurrent_streams_share_engine_steps(server):
    client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=60)

    async def one(i: int) -> tuple[str, str]:
        stream = await client.completions.create(model=NAME, prompt=f"x = {i}", max_tokens=8, temperature=0,
                                                 stream=True, extra_body={"ignore_eos": True})
        text, reason = "", None
        async for chunk in stream:
            text += chunk.choices[0].text
            reason = chunk.choices[0].finish_reason or reason
        return text, reason

    async def main():
        try:
            return await asyncio.gather(*(one(i) for i in range(32)))
        finally:
            await client.close()

    results = asyncio.run(main())
    assert len(results) == 32 and all(reason == "length" for _, reason in results)
    m = server.wait_idle()
    assert m["minivllm_num_requests_running_max{}"] > 1
    assert m['minivllm_batch_size_bucket{"le": "1.0"}'] < m["minivllm_batch_size_count{}"]


def test_client_disconnect_aborts_and_frees_kv_blocks(server):
    aborted = server.wait_idle().get('vllm:request_success_total{"finished_reason": "abort"}', 0)
    body = {"model": NAME, "prompt": "def g(", "max_tokens": 480, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
    m = server.wait_idle()
    assert m["vllm:kv_cache_usage_perc{}"] == 0
    assert m['vllm:request_success_total{"finished_reason": "abort"}'] == aborted + 1


@pytest.mark.parametrize("body,status", [
    ({"model": NAME, "prompt": "x", "temperature": -1}, 400),
    ({"model": NAME, "prompt": "x", "max_tokens": 0}, 400),
    ({"model": NAME, "prompt": "a b " * 600}, 400),
    ({"model": NAME, "prompt": "x", "max_tokens": 600}, 400),  # prompt + max_tokens > max_model_len (512)
    ({"model": NAME, "prompt": "x", "temperature": "hot"}, 400),
    ({"model": NAME, "prompt": {"x": 1}}, 400),
    ({"model": NAME}, 400),
    ({"model": "nope", "prompt": "x"}, 404),
    ('{"model": "tiny", "prompt": ', 400),
])
def test_bad_requests_get_openai_errors(server, body, status):
    kw = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, str) else {"json": body}
    for stream in (False, True):
        if stream and isinstance(body, dict):
            kw["json"] = {**body, "stream": True}
        r = httpx.post(f"{server.url}/v1/completions", timeout=30, **kw)
        assert r.status_code == status, r.text
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"]
    with pytest.raises(openai.BadRequestError):
        server.client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "x"}], top_p=2)
    with pytest.raises(openai.NotFoundError):
        server.client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])


def test_metrics_counters_move(server):
    before = server.wait_idle()
    out = server.client.completions.create(model=NAME, prompt="import os", max_tokens=6, temperature=0,
                                           extra_body={"ignore_eos": True})
    after = server.wait_idle()
    delta = {k: after[k] - before.get(k, 0) for k in after}
    assert delta["vllm:generation_tokens_total{}"] == out.usage.completion_tokens == 6
    assert delta["vllm:prompt_tokens_total{}"] == out.usage.prompt_tokens
    for name in ("time_to_first_token_seconds", "e2e_request_latency_seconds"):
        assert delta[f"vllm:{name}_count{{}}"] == 1
    assert delta["vllm:inter_token_latency_seconds_count{}"] == 5
    assert delta['vllm:request_success_total{"finished_reason": "length"}'] == 1
    assert 0 <= after["minivllm_prefix_cache_hit_rate{}"] <= 1


def test_tokenize_detokenize(server):
    r = httpx.post(f"{server.url}/tokenize", json={"model": NAME, "prompt": "def f(x):"}).json()
    assert r["count"] == len(r["tokens"]) and r["max_model_len"] == 512
    assert httpx.post(f"{server.url}/detokenize", json={"tokens": r["tokens"]}).json() == {"prompt": "def f(x):"}
    chat = httpx.post(f"{server.url}/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    assert chat["count"] > 3
    assert httpx.post(f"{server.url}/detokenize", json={"tokens": [10**6]}).status_code == 400


def test_bench_serve_against_the_server(server, tmp_path, capsys, monkeypatch):
    """``minivllm bench serve`` end to end against this module's server (token-id prompts), with its progress
    bar on a terminal."""
    import minivllm
    from minivllm.entrypoints.bench import serve
    from tests.test_bench_smoke import FakeTerminal

    out = tmp_path / "s.json"
    monkeypatch.setattr(sys, "stderr", FakeTerminal())
    res = serve.main(["--base-url", server.url, "--num-prompts", "4", "--input-len", "8", "--output-len", "6",
                      "--request-rate", "20", "--token-ids", "--max-token-id", "300", "--json-out", str(out)])
    assert "== serving results ==" in capsys.readouterr().out
    assert "Requests: 100%" in sys.stderr.getvalue() and "4/4" in sys.stderr.getvalue()
    saved = json.loads(out.read_text())
    assert saved["completed"] == 4 and saved["failed"] == 0, saved["errors"]
    assert saved["model"] == NAME and saved["version"] == minivllm.__version__
    for key in ("request_throughput", "output_throughput", "mean_ttft_ms", "median_tpot_ms", "p99_itl_ms"):
        assert isinstance(saved[key], (int, float)) and saved[key] > 0, (key, saved[key])
    assert res["total_output_tokens"] == 24
    server.wait_idle()


def test_sigterm_aborts_streams_and_exits_zero(server):
    ended = {}

    def stream():
        body = {"model": NAME, "prompt": "while", "max_tokens": 480, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=30) as r:
            ended["lines"] = [line for line in r.iter_lines() if line]

    t = threading.Thread(target=stream)
    t.start()
    deadline = time.monotonic() + 20
    while server.metrics()["vllm:num_requests_running{}"] == 0:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=30) == 0
    t.join(timeout=10)
    assert ended["lines"][-1] == "data: [DONE]"
    assert '"finish_reason":"abort"' in ended["lines"][-2]


@pytest.mark.parametrize("flag, expected", [([], None), (["--served-model-name", "other"], "other")])
def test_served_model_name_defaults_to_the_model_as_given(tiny_tied_model, monkeypatch, flag, expected):
    """``minivllm serve MODEL`` serves the model under the name MODEL, as typed (a path here), unless
    ``--served-model-name`` says otherwise. In-process: the engine and the app are stubs."""
    from minivllm.entrypoints import cli
    from minivllm.entrypoints.openai import api_server

    class Built(Exception):
        pass

    seen = {}

    def fake_build_app(async_llm, name, config=None, **kwargs):
        seen["name"] = name
        raise Built

    monkeypatch.setattr(api_server.AsyncLLM, "from_model", classmethod(lambda cls, model, **kw: (model, kw)))
    monkeypatch.setattr(api_server, "build_app", fake_build_app)
    as_given = tiny_tied_model + "/"
    with pytest.raises(Built):
        cli.main(["serve", as_given, "--device", "cpu", *flag])
    assert seen["name"] == (expected or as_given)

