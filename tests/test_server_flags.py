"""vLLM's server flags over HTTP, against ``minivllm serve`` of the demo model: ``--enable-tokenizer-info-endpoint``
(``GET /tokenizer_info`` in vLLM's shape, and ``/tokenize``'s ``return_token_strs`` and chat tools),
``--enable-per-request-metrics`` (each response's ``metrics``), ``--show-hidden-metrics-for-version``, vLLM's
per-request histograms in ``/metrics``, and ``--skip-tokenizer-init`` (token ids in, token ids out). The timings
and histograms are also checked in-process on outputs of known timestamps."""

from __future__ import annotations

import json

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from transformers import AutoTokenizer

from minivllm.config.server import ServerConfig
from minivllm.entrypoints.openai.metrics import PrometheusStatLogger, tokens_buckets
from minivllm.entrypoints.openai.request_metrics import request_metrics
from minivllm.entrypoints.openai.tokenizer_info import tokenizer_info_of
from minivllm.outputs import CompletionOutput, RequestOutput
from tests.helpers.server_utils import ROOT, running_server, stream_events

pytestmark = [pytest.mark.server,
              pytest.mark.skipif(not (ROOT / "models" / "minivllm-demo-py").is_dir(), reason="no demo model")]
DEMO = str(ROOT / "models" / "minivllm-demo-py")
NAME = "demo"
ENGINE = ["--served-model-name", NAME, "--device", "cpu", "--max-model-len", "512"]
FLAGS = ["--enable-tokenizer-info-endpoint", "--enable-per-request-metrics", "--show-hidden-metrics-for-version", "0.1"]
USER = [{"role": "user", "content": "What does `bisect.insort` do?"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"location": {"type": "string"}}}}}]
TIMINGS = {"time_to_first_token_ms", "generation_time_ms", "queue_time_ms", "mean_itl_ms", "tokens_per_second"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(DEMO, [*ENGINE, *FLAGS], tmp_path_factory.mktemp("flags")) as srv:
        yield srv


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(DEMO)


def post(server, path: str, body: dict, status: int = 200) -> dict:
    r = httpx.post(server.url + path, json={"model": NAME, **body}, timeout=60)
    assert r.status_code == status, r.text
    return r.json()


def sse_events(server, path: str, body: dict) -> list[dict]:
    return stream_events(server.url, path, {"model": NAME, **body})


# ------------------------------------------------------------------ /tokenizer_info and /tokenize
def test_tokenizer_info_is_the_tokenizers_config_in_vllms_shape(server, tokenizer):
    info = httpx.get(server.url + "/tokenizer_info").json()
    assert info == tokenizer_info_of(tokenizer)
    assert info["tokenizer_class"] == type(tokenizer).__name__ and info["chat_template"] == tokenizer.chat_template
    # the tokenizer's own settings, special tokens as their text, no file paths of the server's disk
    assert info["eos_token"] == "<|endoftext|>" and info["model_max_length"] == 2048
    assert info["added_tokens_decoder"]["0"] == "<|endoftext|>" and "vocab_file" not in info
    json.dumps(info)  # every value is JSON


def test_tokenize_returns_token_strings_when_asked(server, tokenizer):
    prompt = "def add(a, b): return a + b"
    out = post(server, "/tokenize", {"prompt": prompt, "return_token_strs": True})
    ids = tokenizer.encode(prompt)
    assert out["tokens"] == ids and out["token_strs"] == tokenizer.convert_ids_to_tokens(ids)
    assert out["count"] == len(ids) and out["max_model_len"] == 512
    assert post(server, "/tokenize", {"prompt": prompt})["token_strs"] is None


@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_tokenize_chat_with_tools_renders_them_as_the_chat_template_does(server, tokenizer, add_generation_prompt):
    body = {"messages": USER, "tools": TOOLS, "add_generation_prompt": add_generation_prompt}
    want = tokenizer.encode(tokenizer.apply_chat_template(USER, tools=TOOLS, tokenize=False,
                                                          add_generation_prompt=add_generation_prompt),
                            add_special_tokens=False)
    assert post(server, "/tokenize", body)["tokens"] == want
    assert "get_weather" in tokenizer.decode(want)


# ------------------------------------------------------------------ --enable-per-request-metrics
def test_a_response_carries_its_timings(server):
    chat = post(server, "/v1/chat/completions", {"messages": USER, "max_tokens": 4, "min_tokens": 4})
    assert set(chat["metrics"]) == TIMINGS and all(v >= 0 for v in chat["metrics"].values())
    m = chat["metrics"]
    assert m["mean_itl_ms"] == pytest.approx(m["generation_time_ms"] / 3)
    completion = post(server, "/v1/completions", {"prompt": "def f(x):", "max_tokens": 3, "min_tokens": 3})
    assert set(completion["metrics"]) == TIMINGS


def test_a_stream_carries_them_on_its_usage_chunk_alone(server):
    *chunks, last = sse_events(server, "/v1/chat/completions", {
        "messages": USER, "max_tokens": 1, "min_tokens": 1, "stream_options": {"include_usage": True}})
    assert all("metrics" not in c for c in chunks)
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 1
    # one token: no inter-token latency, so it is left out (as vLLM)
    assert set(last["metrics"]) == TIMINGS - {"mean_itl_ms"}
    *chunks, last = sse_events(server, "/v1/completions", {"prompt": "def f(x):", "max_tokens": 2,
                                                           "stream_options": {"include_usage": True}})
    assert all("metrics" not in c for c in chunks) and "tokens_per_second" in last["metrics"]
    assert all("metrics" not in c for c in sse_events(server, "/v1/completions", {"prompt": "x", "max_tokens": 2}))


def test_no_timings_for_several_completions_or_prompts(server):
    assert "metrics" not in post(server, "/v1/chat/completions", {"messages": USER, "max_tokens": 2, "n": 2})
    assert "metrics" not in post(server, "/v1/completions", {"prompt": ["a", "b"], "max_tokens": 2})


def test_request_metrics_of_known_timestamps():
    out = RequestOutput("r", None, [1, 2], [CompletionOutput(0, token_ids=[5, 6, 7])], finished=True,
                        arrival_time=10.0, scheduled_time=10.5, first_token_time=11.0, last_token_time=12.0)
    m = request_metrics(out, 3).model_dump()
    assert m == pytest.approx({"time_to_first_token_ms": 500.0, "generation_time_ms": 1000.0,
                               "queue_time_ms": 500.0, "mean_itl_ms": 500.0, "tokens_per_second": 2.0})
    never = RequestOutput("r", None, [1], [CompletionOutput(0)], finished=True, arrival_time=10.0)
    assert request_metrics(never, 0).model_dump() == {}


# ------------------------------------------------------------------ /metrics
def test_vllms_per_request_histograms_and_cache_info(server):
    def scrape() -> dict:
        text = httpx.get(server.url + "/metrics").text
        return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))): s.value
                for f in text_string_to_metric_families(text) for s in f.samples}

    before = scrape()
    post(server, "/v1/completions", {"prompt": [5, 6, 7, 8], "max_tokens": 3, "ignore_eos": True})
    server.wait_idle()
    after = scrape()

    def moved(name: str) -> float:
        return after[(name, ())] - before.get((name, ()), 0.0)

    assert moved("vllm:request_prompt_tokens_sum") == 4 and moved("vllm:request_generation_tokens_sum") == 3
    assert moved("vllm:request_params_max_tokens_sum") == 3 and moved("vllm:request_params_n_sum") == 1
    assert moved("vllm:request_num_preemptions_sum") == 0
    for phase in ("queue", "prefill", "decode", "inference"):
        assert moved(f"vllm:request_{phase}_time_seconds_count") == 1
    assert after[("vllm:admission_rejections_total", (("reason", "max_num_queued_reqs"),))] == 0
    (info,) = [labels for name, labels in after if name == "vllm:cache_config_info"]
    info = dict(info)
    tokens = int(info["block_size"]) * int(info["num_gpu_blocks"])
    assert int(info["kv_cache_size_tokens"]) == tokens
    assert float(info["kv_cache_max_concurrency"]) == pytest.approx(tokens / 512, abs=0.01)


def test_histograms_of_a_finished_request_in_process():
    stats = PrometheusStatLogger("m")
    stats.on_cache_config(16, 4, 100)
    out = RequestOutput("r", None, [1, 2, 3], [CompletionOutput(0, token_ids=[4, 5], finish_reason="length"),
                                               CompletionOutput(1, token_ids=[6], finish_reason="stop")],
                        finished=True, arrival_time=1.0, scheduled_time=1.5, first_token_time=2.5,
                        last_token_time=4.0, num_preemptions=2, max_tokens=2)
    stats._on_output(out, 5.0)
    stats.on_admission_rejection()
    got = {s.name: s.value for f in text_string_to_metric_families(stats.render().decode()) for s in f.samples
           if s.labels.get("reason", "max_num_queued_reqs") == "max_num_queued_reqs"}
    assert got["vllm:request_queue_time_seconds_sum"] == 0.5 and got["vllm:request_prefill_time_seconds_sum"] == 1.0
    assert got["vllm:request_decode_time_seconds_sum"] == 1.5 and got["vllm:request_inference_time_seconds_sum"] == 2.5
    assert got["vllm:request_num_preemptions_sum"] == 2 and got["vllm:request_params_n_sum"] == 2
    assert got["vllm:request_prompt_tokens_sum"] == 3 and got["vllm:request_generation_tokens_sum"] == 3
    assert got["vllm:request_params_max_tokens_sum"] == 2 and got["vllm:admission_rejections_total"] == 1
    assert tokens_buckets(100) == [1, 2, 5, 10, 20, 50, 100] and tokens_buckets(7) == [1, 2, 5]


def test_show_hidden_metrics_for_version_takes_a_version():
    assert ServerConfig(show_hidden_metrics_for_version="0.32").show_hidden_metrics_for_version == "0.32"
    with pytest.raises(ValueError, match="show_hidden_metrics_for_version"):
        ServerConfig(show_hidden_metrics_for_version="latest")


# ------------------------------------------------------------------ --skip-tokenizer-init
@pytest.fixture(scope="module")
def no_tokenizer(tmp_path_factory):
    with running_server(DEMO, [*ENGINE, "--skip-tokenizer-init"], tmp_path_factory.mktemp("no-tok")) as srv:
        yield srv


def test_token_ids_in_token_ids_out(no_tokenizer, server):
    body = {"prompt": [5, 6, 7, 8], "max_tokens": 4, "temperature": 0, "ignore_eos": True, "echo": True,
            "return_token_ids": True}
    (choice,) = post(no_tokenizer, "/v1/completions", body)["choices"]
    (ref,) = post(server, "/v1/completions", body)["choices"]
    assert choice["text"] == "" and choice["prompt_token_ids"] == [5, 6, 7, 8]
    assert choice["token_ids"] == ref["token_ids"] and len(choice["token_ids"]) == 4
    # logprobs name the tokens by id: they have no text
    lp = post(no_tokenizer, "/v1/completions", {**body, "logprobs": 1})["choices"][0]["logprobs"]
    assert lp["tokens"] == [f"token_id:{t}" for t in [5, 6, 7, 8, *choice["token_ids"]]]  # echo: the prompt's too


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", {"prompt": "def f(x):"}, "prompt"),
    ("/v1/completions", {"prompt": [5, 6], "stop": ["\n"]}, "stop"),
    ("/v1/chat/completions", {"messages": USER}, "prompt"),
    ("/tokenize", {"prompt": "def"}, "prompt"),
    ("/detokenize", {"tokens": [5]}, "tokens"),
])
def test_what_needs_a_tokenizer_gets_a_400_naming_the_field(no_tokenizer, path, body, param):
    err = post(no_tokenizer, path, body, 400)["error"]
    assert err["param"] == param and "tokenizer" in err["message"]


def test_without_the_flags_the_route_and_the_timings_are_absent(no_tokenizer):
    assert httpx.get(no_tokenizer.url + "/tokenizer_info").status_code == 404
    assert "metrics" not in post(no_tokenizer, "/v1/completions", {"prompt": [5, 6], "max_tokens": 2})
