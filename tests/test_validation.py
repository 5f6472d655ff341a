"""Bad input raises a clear error and leaves the engine usable; config loading and validation."""

import json
import subprocess
import sys

import pytest
import torch

from conftest import read_config
from minivllm import LLM, SamplingParams
from minivllm.config import Config, ModelConfig
from minivllm.utils.hf_config import load_model_config, model_config_from_dict

OK = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_tied_model):
    return LLM(tiny_tied_model, device="cpu", max_model_len=64)


@pytest.mark.parametrize("prompt, params, match", [
    ([1] * 64, OK, "max_model_len is 64"),
    ("", OK, "prompt is empty"),
    ([], OK, "prompt is empty"),
    ([1, 2, 10_000], OK, "token id 10000 is outside the vocabulary"),
    ([1, -1], OK, "token id -1 is outside"),
    (3.5, OK, "must be a string or a list of token ids"),
])
def test_bad_prompts_raise_and_engine_stays_usable(llm, prompt, params, match):
    with pytest.raises(ValueError, match=match):
        llm.generate([prompt], params, use_tqdm=False)
    with pytest.raises(ValueError, match=match):
        llm.add_request(prompt, params)
    assert not llm.has_unfinished_requests() and llm.scheduler.is_finished()
    out = llm.generate(["def f():"], OK, use_tqdm=False)
    assert len(out[0]["token_ids"]) == 4


def test_one_bad_prompt_in_a_batch_adds_nothing(llm):
    with pytest.raises(ValueError):
        llm.generate(["fine", [99999]], OK, use_tqdm=False)
    assert llm.scheduler.is_finished()


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_tokens=0), "max_tokens must be an integer >= 1"),
    (dict(temperature=-0.5), "temperature must be a finite number >= 0"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_k=-3), "top_k"),
    (dict(n=0), "n must be"),
])
def test_bad_sampling_params(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_unknown_engine_argument_is_a_type_error(tiny_tied_model):
    with pytest.raises(TypeError, match="max_num_seq, not_a_flag"):
        LLM(tiny_tied_model, device="cpu", max_num_seq=4, not_a_flag=1)


@pytest.mark.parametrize("kwargs, match", [
    (dict(kvcache_block_size=24), "power of two"),
    (dict(kvcache_block_size=8), "power of two"),
    (dict(kvcache_block_size=512), "power of two"),
    (dict(gpu_memory_utilization=0), "gpu_memory_utilization"),
    (dict(device="tpu"), "device"),
    (dict(max_model_len=4096), "max_position_embeddings"),
    (dict(dtype="int8"), "dtype"),
    (dict(tensor_parallel_size=3), "divisible"),
    (dict(num_kvcache_blocks=0), "num_kvcache_blocks"),
    (dict(async_scheduling="yes"), r"async_scheduling must be a bool or None, got 'yes' \(str\)"),
    (dict(tensor_parallel_size="2"), r"tensor_parallel_size must be an int, got '2' \(str\)"),
    (dict(max_num_seqs=2.5), r"max_num_seqs must be an int, got 2.5 \(float\)"),
    (dict(max_model_len=True), r"max_model_len must be an int or None, got True \(bool\)"),
    (dict(gpu_memory_utilization="0.5"), "gpu_memory_utilization must be a float"),
    (dict(enforce_eager=1), r"enforce_eager must be a bool, got 1 \(int\)"),
    (dict(device=None), "device must be a str"),
])
def test_config_validation(kwargs, match):
    mc = ModelConfig("Qwen3ForCausalLM", 100, 64, 128, 2, 4, 2, 16, max_position_embeddings=1024)
    with pytest.raises(ValueError, match=match):
        Config(model="x", model_config=mc, **{"device": "cpu", **kwargs})


def test_config_accepts_numpy_ints_and_int_floats():
    import numpy as np

    mc = ModelConfig("Qwen3ForCausalLM", 100, 64, 128, 2, 4, 2, 16, max_position_embeddings=1024)
    cfg = Config(model="x", model_config=mc, device="cpu", max_num_seqs=np.int64(8), gpu_memory_utilization=1)
    assert cfg.max_num_seqs == 8 and cfg.gpu_memory_utilization == 1


@pytest.mark.parametrize("cuda, count, kwargs, match", [
    (False, 0, dict(device="cuda"), "sees no CUDA GPU"),
    (True, 1, dict(device="cuda", tensor_parallel_size=2), r"needs GPUs 0\.\.1, but torch sees 1 GPU$"),
    (True, 2, dict(device="cuda:1", tensor_parallel_size=2), r"needs GPUs 1\.\.2, but torch sees 2 GPUs"),
    (True, 1, dict(device="cuda:1"), r"needs GPU 1, but torch sees 1 GPU"),
])
def test_missing_gpus_are_a_clear_error(tiny_tied_model, monkeypatch, cuda, count, kwargs, match):
    """Asked-for GPUs that torch cannot see: a ValueError from ``LLM`` before any process starts (it was an
    AttributeError from inside torch on a CPU-only build)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    with pytest.raises(ValueError, match=match):
        LLM(tiny_tied_model, **kwargs)


def test_model_may_be_a_path(tiny_tied_model):
    from pathlib import Path

    with LLM(Path(tiny_tied_model), device="cpu", max_model_len=128) as llm:
        assert llm.config.model == tiny_tied_model


@pytest.mark.parametrize("device, expected", [("cpu", False), ("cuda", True)])
def test_async_scheduling_defaults_to_on_with_a_gpu(device, expected):
    mc = ModelConfig("Qwen3ForCausalLM", 100, 64, 128, 2, 4, 2, 16, max_position_embeddings=1024)
    assert Config(model="x", model_config=mc, device=device).async_scheduling is expected
    assert Config(model="x", model_config=mc, device=device, async_scheduling=not expected).async_scheduling is (
        not expected)


def test_cache_smaller_than_one_sequence_is_rejected(tiny_tied_model):
    with pytest.raises(ValueError, match="fewer than max_model_len"):
        LLM(tiny_tied_model, device="cpu", num_kvcache_blocks=2, max_model_len=64)


def test_reads_transformers_4_and_5_config_layouts(tiny_tied_model, tmp_path):
    v5 = read_config(tiny_tied_model)
    assert "rope_parameters" in v5 and "dtype" in v5
    mc5 = load_model_config(tiny_tied_model)
    v4 = {k: v for k, v in v5.items() if k not in ("rope_parameters", "dtype")}
    v4.update(rope_theta=mc5.rope_theta, torch_dtype="float32", eos_token_id=[mc5.eos_token_ids[0], 7])
    mc4 = model_config_from_dict(v4, {"eos_token_id": 9})
    assert mc4.rope_theta == mc5.rope_theta == 10000.0 and mc4.dtype == mc5.dtype == "float32"
    assert mc4.eos_token_ids == [mc5.eos_token_ids[0], 7, 9]
    for name in ("qwen3-0.6b", "qwen3-8b", "qwen3-32b", "llama-3.1-8b-instruct"):
        path = f"{__import__('os').path.dirname(__file__)}/../../shared/model-configs/{name}.json"
        try:
            cfg = json.load(open(path))
        except FileNotFoundError:
            pytest.skip("shared model configs not beside the checkout")
        mc = model_config_from_dict(cfg)
        assert mc.head_dim == 128 and mc.dtype == "bfloat16" and mc.eos_token_ids


def test_scheduler_modules_do_not_import_torch():
    code = ("import sys, minivllm.engine.sequence, minivllm.engine.block_manager, minivllm.engine.scheduler; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_ids_past_the_tokenizer_vocab_decode_to_nothing(llm):
    n = len(llm.tokenizer)
    assert llm.config.model_config.vocab_size > n  # the model's vocab is larger, as in Qwen3
    assert llm.decode([5, n, llm.config.model_config.vocab_size - 1, 6]) == llm.decode([5, 6])
    out = llm.generate([[5, 6, n + 1]], OK, use_tqdm=False)[0]  # such ids are valid prompt tokens
    assert len(out["token_ids"]) == 4 and isinstance(out["text"], str)


def test_triton_on_the_cpu_needs_the_interpreter(monkeypatch):
    """Triton kernels asked for on the CPU outside the interpreter: a clear error, not Triton's
    "0 active drivers" from inside the first step."""
    from minivllm.layers.sampler import fused_sampler_enabled

    mc = ModelConfig("Qwen3ForCausalLM", 100, 64, 128, 2, 4, 2, 16, max_position_embeddings=1024)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="attention_backend='triton' on the CPU needs TRITON_INTERPRET=1"):
        Config(model="x", model_config=mc, device="cpu", attention_backend="triton")
    assert Config(model="x", model_config=mc, device="cpu").attention_backend == "torch"
    monkeypatch.setenv("MINIVLLM_FUSED_SAMPLER", "1")
    with pytest.raises(ValueError, match="MINIVLLM_FUSED_SAMPLER=1 on the CPU needs TRITON_INTERPRET=1"):
        fused_sampler_enabled(torch.device("cpu"))
    assert fused_sampler_enabled(torch.device("cuda", 0))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert fused_sampler_enabled(torch.device("cpu"))
    assert Config(model="x", model_config=mc, device="cpu", attention_backend="triton").attention_backend == "triton"
