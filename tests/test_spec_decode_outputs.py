"""Speculative decoding as users see it: the config (``LLM(speculative_config=...)``, ``--speculative-config``),
vLLM's ``vllm:spec_decode_*`` metrics, and the acceptance figures in ``minivllm bench`` output."""

from __future__ import annotations

import json

import pytest
from prometheus_client import generate_latest

from minivllm.config import Config, SpeculativeConfig
from minivllm.engine.progress import ThroughputMeter
from minivllm.engine.spec_decode_stats import SpecDecodeCounters
from minivllm.entrypoints.args import engine_kwargs, serve_parser
from minivllm.entrypoints.bench import latency, serve, throughput
from minivllm.entrypoints.openai.metrics import PrometheusStatLogger
from minivllm.outputs import StepStats
from tests.helpers.server_utils import running_server
from tests.helpers.spec_decode_checks import DEMO_MODEL, NGRAM, REPETITIVE_PROMPTS

SPEC_JSON = json.dumps(NGRAM)


def test_config_from_a_dict_or_json_and_its_defaults():
    assert SpeculativeConfig.of(SPEC_JSON) == SpeculativeConfig.of(NGRAM)
    lone = SpeculativeConfig.of({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4})
    assert (lone.prompt_lookup_min, lone.prompt_lookup_max) == (4, 4)  # one bound given: both (vLLM's)
    neither = SpeculativeConfig(method="ngram", num_speculative_tokens=3)
    assert (neither.prompt_lookup_min, neither.prompt_lookup_max) == (5, 5)
    assert SpeculativeConfig(model="/ckpt/EAGLE3-LLaMA3.1", num_speculative_tokens=3).method == "eagle3"
    assert SpeculativeConfig(model="/ckpt/qwen3-0.6b", num_speculative_tokens=3).method == "draft_model"


@pytest.mark.parametrize("value, named", [
    ({"method": "ngram"}, "needs num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens must be >= 1"),
    ({"method": "ngram", "num_speculative_tokens": "4"}, "num_speculative_tokens must be an integer"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 5, "prompt_lookup_max": 2},
     "prompt_lookup_min"),
    ({"method": "eagle3", "num_speculative_tokens": 2}, "needs a model"),
    ({"method": "ngram", "num_speculative_tokens": 2, "model": "x"}, "not used by method 'ngram'"),
    ({"method": "ngram", "num_speculative_tokens": 2, "disable_by_batch_size": 0}, "disable_by_batch_size"),
    ({}, "needs a method"),
    ("[1, 2]", "must be a JSON object"),
    ("{bad json", "must be a JSON object"),
])
def test_bad_config_is_a_value_error_naming_it(value, named):
    with pytest.raises(ValueError, match=named):
        SpeculativeConfig.of(value)


def test_serve_flag_reaches_the_config():
    args = serve_parser().parse_args([DEMO_MODEL, "--speculative-config", SPEC_JSON])
    kw = engine_kwargs(args)
    assert kw["speculative_config"] == SPEC_JSON
    config = Config.create(DEMO_MODEL, device="cpu", **kw)
    assert config.speculative_config == SpeculativeConfig.of(NGRAM)
    with pytest.raises(ValueError, match="watermark_config"):
        Config.create(DEMO_MODEL, device="cpu", watermark_config={"key": 1}, **kw)
    with pytest.raises(ValueError, match="no config.json"):
        Config.create(DEMO_MODEL, device="cpu", speculative_config={"method": "draft_model", "model": "/no/such",
                                                                    "num_speculative_tokens": 2})


def test_prometheus_counters_have_vllms_names():
    logger = PrometheusStatLogger("demo")
    logger.on_step([], StepStats(spec_num_drafts=3, spec_num_draft_tokens=10, spec_num_accepted_tokens=6,
                                 spec_accepted_per_pos=(3, 2, 1, 0)), 0.0)
    logger.on_step([], StepStats(spec_num_drafts=1, spec_num_draft_tokens=4, spec_num_accepted_tokens=4,
                                 spec_accepted_per_pos=(1, 1, 1, 1)), 1.0)
    text = generate_latest(logger.registry).decode()
    for line in ('vllm:spec_decode_num_drafts_total{model_name="demo"} 4.0',
                 'vllm:spec_decode_num_draft_tokens_total{model_name="demo"} 14.0',
                 'vllm:spec_decode_num_accepted_tokens_total{model_name="demo"} 10.0',
                 'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="demo",position="0"} 4.0',
                 'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="demo",position="3"} 1.0'):
        assert line in text, line


def test_counters_give_the_acceptance_figures():
    c = SpecDecodeCounters(4)
    before = c.copy()
    c.num_drafts, c.num_draft_tokens, c.num_accepted_tokens, c.per_pos = 10, 40, 25, [9, 7, 5, 4]
    s = c.since(before).summary()
    assert s["acceptance_rate"] == 25 / 40 and s["mean_acceptance_length"] == 1 + 25 / 10
    assert s["acceptance_rate_per_pos"] == [0.9, 0.7, 0.5, 0.4]
    assert SpecDecodeCounters(4).summary()["mean_acceptance_length"] == 1.0  # nothing proposed


def test_progress_bar_counts_generated_tokens_not_rejected_drafts():
    meter = ThroughputMeter()
    # 4 rows verifying 3 drafts each (16 tokens computed), 5 drafts accepted: 4 + 5 tokens generated
    text = meter.update(StepStats(num_decode_tokens=16, spec_num_drafts=4, spec_num_draft_tokens=12,
                                  spec_num_accepted_tokens=5, step_time=0.5))
    assert meter.tokens["decode"] == 9 and text.endswith("decode=18tok/s")


def test_bench_latency_and_throughput_report_acceptance(capsys):
    engine = ["--model", DEMO_MODEL, "--device", "cpu", "--max-model-len", "256", "--speculative-config", SPEC_JSON]
    res = latency.main([*engine, "--batch-size", "2", "--input-len", "16", "--output-len", "24", "--num-iters", "1",
                        "--num-iters-warmup", "0"])
    spec = res["speculative_decoding"]
    assert spec["num_draft_tokens"] >= spec["num_accepted_tokens"] >= 0
    assert 1.0 <= spec["mean_acceptance_length"] <= 1 + NGRAM["num_speculative_tokens"]
    assert "spec decode: acceptance rate" in capsys.readouterr().out
    res = throughput.main([*engine, "--workload", "fixed-batch", "--num-requests", "2", "--input-len", "16",
                           "--output-len", "24"])
    assert "acceptance_rate" in res["speculative_decoding"]
    assert "spec decode: mean acceptance length" in capsys.readouterr().out


@pytest.mark.slow
def test_server_with_speculative_config_counts_accepted_drafts(tmp_path):
    flags = ["--device", "cpu", "--max-model-len", "512", "--served-model-name", "demo",
             "--speculative-config", SPEC_JSON]
    with running_server(DEMO_MODEL, flags, tmp_path) as srv:
        before = srv.wait_idle()
        for prompt in REPETITIVE_PROMPTS[:4]:
            r = srv.client.completions.create(model="demo", prompt=prompt, max_tokens=32, temperature=0)
            assert r.choices[0].text
        after = srv.wait_idle()
        res = serve.main(["--base-url", srv.url, "--num-prompts", "4", "--input-len", "16", "--output-len", "48",
                          "--disable-tqdm"])
    spec = res["speculative_decoding"]  # bench serve's figures, from the server's counters over its run
    assert spec["num_drafts"] > 0 and spec["num_draft_tokens"] >= spec["num_accepted_tokens"]
    for name in ("vllm:spec_decode_num_drafts_total{}", "vllm:spec_decode_num_accepted_tokens_total{}"):
        assert after[name] > before.get(name, 0), name
    assert after["vllm:spec_decode_num_draft_tokens_total{}"] >= after["vllm:spec_decode_num_accepted_tokens_total{}"]
