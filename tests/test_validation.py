"""Bad input raises a clear error and leaves the engine usable; config loading and validation."""

import argparse
import subprocess
import sys

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.config import (
    ArchConfig,
    CacheConfig,
    Config,
    DeviceConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
)
from minivllm.config.hf import arch_from_dict, load_arch
from minivllm.entrypoints.bench.models import resolve_model
from tests.helpers.checkpoints import read_config

OK = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_tied_model):
    return LLM(tiny_tied_model, device="cpu", max_model_len=64)


@pytest.mark.parametrize("prompt, params, match", [
    ([1] * 64, OK, "max_model_len is 64"),
    ("", OK, "^The decoder prompt cannot be empty$"),
    ([], OK, "^The decoder prompt cannot be empty$"),
    ([1, 2, 10_000, 9_999], OK, "^Token id 10000 is out of vocabulary"),
    ([1, -1], OK, "^Token id -1 is out of vocabulary"),
    (3.5, OK, "must be a string or a list of token ids"),
])
def test_bad_prompts_raise_and_engine_stays_usable(llm, prompt, params, match):
    with pytest.raises(ValueError, match=match):
        llm.generate([prompt], params, use_tqdm=False)
    with pytest.raises(ValueError, match=match):
        llm.engine.add_request(prompt, params)
    assert not llm.engine.has_unfinished_requests() and llm.engine.scheduler.is_finished()
    out = llm.generate(["def f():"], OK, use_tqdm=False)
    assert len(out[0]["token_ids"]) == 4


@pytest.mark.parametrize("prompts, params, match", [
    (None, OK, "^prompts must be a string, a list of token ids, or a list of those, got NoneType"),
    ({"prompt": "x"}, OK, "^prompts must be .* got dict"),
    (["x", None], OK, "^a prompt must be a string or a list of token ids, got NoneType"),
    ("x", {"temperature": 0}, "^sampling_params must be a SamplingParams or a list of them, got dict"),
    ("x", [{"temperature": 0}], "^sampling_params must be a SamplingParams, got dict"),
    ("x", "greedy", "^sampling_params must be a SamplingParams or a list of them, got str"),
])
def test_bad_generate_arguments_name_the_parameter(llm, prompts, params, match):
    """``generate(None)`` and a dict of sampling parameters are ValueErrors naming the parameter, not a TypeError
    or an AttributeError from deep inside."""
    with pytest.raises(ValueError, match=match):
        llm.generate(prompts, params, use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()


def test_structured_outputs_params_is_exported():
    import minivllm
    from minivllm.sampling_params import StructuredOutputsParams

    assert minivllm.StructuredOutputsParams is StructuredOutputsParams
    assert "StructuredOutputsParams" in minivllm.__all__


def test_an_over_long_prompt_is_one_error_without_the_tokenizers_warning(llm):
    """The engine names max_model_len; transformers' "Token indices sequence length" warning is not repeated in
    the log, while the tokenizer's other warnings stay."""
    import logging

    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    source = logging.getLogger("transformers.tokenization_utils_base")
    source.addHandler(handler)
    tokenizer = llm.get_tokenizer()
    limit, tokenizer.model_max_length = tokenizer.model_max_length, 16  # NOTE: below the prompt, as a real model's
    try:
        with pytest.raises(ValueError, match="max_model_len is 64"):
            llm.generate("x = 1\n" * 40, OK, use_tqdm=False)
        assert not [r for r in records if "Token indices" in r.getMessage()], records
        fresh = type(tokenizer).from_pretrained(llm.engine.config.model_config.model)  # as transformers loads it
        fresh.model_max_length = 16
        fresh.encode("x = 1\n" * 40)
        assert [r for r in records if "Token indices" in r.getMessage()]  # the check above would have seen it
    finally:
        tokenizer.model_max_length = limit
        source.removeHandler(handler)


def test_one_bad_prompt_in_a_batch_adds_nothing(llm):
    with pytest.raises(ValueError):
        llm.generate(["fine", [99999]], OK, use_tqdm=False)
    assert llm.engine.scheduler.is_finished()


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


ARCH = ArchConfig("Qwen3ForCausalLM", 100, 64, 128, 2, 4, 2, 16, max_position_embeddings=1024)


def create(**engine_args) -> Config:
    """A Config for a made-up model (``arch`` given: no checkpoint is read); the CPU unless ``device`` says."""
    return Config.create("x", arch=ARCH, **{"device": "cpu", **engine_args})


@pytest.mark.parametrize("kwargs, match", [
    (dict(kvcache_block_size=24), "kvcache_block_size must be a power of two"),
    (dict(kvcache_block_size=8), "kvcache_block_size must be a power of two"),
    (dict(kvcache_block_size=512), "kvcache_block_size must be a power of two"),
    (dict(gpu_memory_utilization=0), "gpu_memory_utilization"),
    (dict(cpu_kvcache_space_gib=0.0), "cpu_kvcache_space_gib"),
    (dict(device="tpu"), "device must be"),
    (dict(device="cuda:x"), "device must be"),
    (dict(max_model_len=4096), r"max_model_len \(4096\) exceeds the model's max_position_embeddings"),
    (dict(max_model_len=0), "max_model_len must be >= 1"),
    (dict(dtype="int8"), "dtype must be one of"),
    (dict(kv_cache_dtype="fp4"), "kv_cache_dtype must be one of"),
    (dict(load_format="pt"), "load_format must be one of"),
    (dict(attention_backend="flash"), "attention_backend must be one of"),
    (dict(tensor_parallel_size=3), r"divisible by tensor_parallel_size \(3\)"),
    (dict(tensor_parallel_size=0), "tensor_parallel_size must be >= 1"),
    (dict(num_kvcache_blocks=0), "num_kvcache_blocks"),
    (dict(max_num_seqs=0), "max_num_seqs must be >= 1"),
    (dict(max_long_partial_prefills=2), "max_long_partial_prefills must not exceed max_num_partial_prefills"),
    (dict(long_prefill_threshold=-1), "long_prefill_threshold must be >= 0"),
    (dict(enable_chunked_prefill=False, max_num_batched_tokens=100, max_model_len=200),
     r"max_num_batched_tokens \(100\) must be >= max_model_len \(200\)"),
    (dict(cpu_threads=0), "cpu_threads must be >= 1"),
    (dict(async_scheduling="yes"), r"async_scheduling must be a bool or None, got 'yes' \(str\)"),
    (dict(tensor_parallel_size="2"), r"tensor_parallel_size must be an int, got '2' \(str\)"),
    (dict(max_num_seqs=2.5), r"max_num_seqs must be an int, got 2.5 \(float\)"),
    (dict(max_model_len=True), r"max_model_len must be an int or None, got True \(bool\)"),
    (dict(gpu_memory_utilization="0.5"), "gpu_memory_utilization must be a float"),
    (dict(enforce_eager=1), r"enforce_eager must be a bool, got 1 \(int\)"),
    (dict(disable_custom_all_reduce="no"), "disable_custom_all_reduce must be a bool"),
    (dict(cpu_threads=2.0), r"cpu_threads must be an int or None, got 2.0 \(float\)"),
    (dict(device=3), r"device must be a str, got 3 \(int\)"),
])
def test_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        create(**kwargs)


def test_sub_configs_validate_on_their_own():
    """Each sub-config checks its own fields when built directly, as ``Config.create`` builds it."""
    with pytest.raises(ValueError, match="device must be a str, got None"):
        DeviceConfig(device=None)
    with pytest.raises(ValueError, match="kvcache_block_size must be a power of two"):
        CacheConfig(kvcache_block_size=24)
    with pytest.raises(ValueError, match="max_num_seqs must be an int"):
        SchedulerConfig(max_num_seqs="8")
    with pytest.raises(ValueError, match="tensor_parallel_size must be >= 1"):
        ParallelConfig(tensor_parallel_size=0)
    with pytest.raises(ValueError, match="max_model_len"):
        ModelConfig("x", ARCH, max_model_len=2048)
    with pytest.raises(ValueError, match="num_attention_heads"):
        ArchConfig("Qwen3ForCausalLM", 100, 64, 128, 2, 4, 3, 16)
    with pytest.raises(ValueError, match="head_dim must be >= 1"):
        ArchConfig("Qwen3ForCausalLM", 100, 64, 128, 2, 4, 2, 0)
    with pytest.raises(ValueError, match=r"tensor_parallel_size \(8\)"):
        Config(ModelConfig("x", ARCH), parallel_config=ParallelConfig(tensor_parallel_size=8),
               device_config=DeviceConfig(device="cpu"))
    cfg = Config(ModelConfig("x", ARCH), device_config=DeviceConfig(device="cpu"))
    assert cfg.model_config.max_model_len == 1024 and cfg.cache_config.kvcache_block_size == 16


def test_engine_arguments_route_to_their_sub_configs():
    names = Config.engine_arg_names()
    assert {"model", "arch"}.isdisjoint(names)
    assert names["dtype"] == names["max_model_len"] == "model_config"
    assert names["kv_cache_dtype"] == names["num_kvcache_blocks"] == "cache_config"
    assert names["max_num_batched_tokens"] == names["async_scheduling"] == "scheduler_config"
    assert names["tensor_parallel_size"] == names["disable_custom_all_reduce"] == "parallel_config"
    assert names["attention_backend"] == names["cpu_threads"] == "device_config"
    cfg = create(max_model_len=512, kvcache_block_size=32, max_num_seqs=7, disable_custom_all_reduce=True,
                 cpu_threads=3, seed=5)
    assert (cfg.model_config.max_model_len, cfg.model_config.seed) == (512, 5)
    assert cfg.cache_config.kvcache_block_size == 32 and cfg.scheduler_config.max_num_seqs == 7
    assert cfg.parallel_config.disable_custom_all_reduce and cfg.device_config.cpu_threads == 3
    assert cfg.model_config.arch is ARCH and cfg.model_config.model == "x"


def test_create_without_a_device_takes_the_default_one():
    assert create(device=None).device_config.device == ("cuda" if torch.cuda.is_available() else "cpu")


def test_config_accepts_numpy_ints_and_int_floats():
    import numpy as np

    cfg = create(max_num_seqs=np.int64(8), gpu_memory_utilization=1)
    assert cfg.scheduler_config.max_num_seqs == 8 and cfg.cache_config.gpu_memory_utilization == 1


@pytest.mark.parametrize("device, dtype", [("cpu", "float32"), ("cuda", "bfloat16")])
def test_dtype_defaults_to_float32_on_the_cpu_and_the_checkpoints_on_a_gpu(device, dtype):
    cfg = Config(ModelConfig("x", ARCH), device_config=DeviceConfig(device=device))
    assert ARCH.dtype == "bfloat16" and cfg.model_config.dtype == dtype
    assert create(dtype="bfloat16").model_config.dtype == "bfloat16"


def test_bad_environment_variable_names_it(monkeypatch):
    monkeypatch.setenv("MINIVLLM_TP_TIMEOUT_S", "soon")
    with pytest.raises(ValueError, match="MINIVLLM_TP_TIMEOUT_S"):
        create()
    monkeypatch.setenv("MINIVLLM_TP_TIMEOUT_S", "12.5")
    assert create().envs.tp_timeout_s == 12.5


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
        assert llm.engine.config.model_config.model == tiny_tied_model


@pytest.mark.parametrize("device, expected", [("cpu", False), ("cuda", True)])
def test_async_scheduling_defaults_to_on_with_a_gpu(device, expected):
    """Built from the sub-configs directly: ``Config.create(device="cuda")`` would look for a GPU."""
    dc = DeviceConfig(device=device)
    assert Config(ModelConfig("x", ARCH), device_config=dc).scheduler_config.async_scheduling is expected
    sc = SchedulerConfig(async_scheduling=not expected)
    assert Config(ModelConfig("x", ARCH), scheduler_config=sc, device_config=dc).scheduler_config.async_scheduling is (
        not expected)


def test_cache_smaller_than_one_sequence_is_rejected(tiny_tied_model):
    with pytest.raises(ValueError, match="fewer than max_model_len"):
        LLM(tiny_tied_model, device="cpu", num_kvcache_blocks=2, max_model_len=64)


def test_reads_transformers_4_and_5_config_layouts(tiny_tied_model, tmp_path):
    v5 = read_config(tiny_tied_model)
    assert "rope_parameters" in v5 and "dtype" in v5
    mc5 = load_arch(tiny_tied_model)
    v4 = {k: v for k, v in v5.items() if k not in ("rope_parameters", "dtype")}
    v4.update(rope_theta=mc5.rope_theta, torch_dtype="float32", eos_token_id=[mc5.eos_token_ids[0], 7])
    mc4 = arch_from_dict(v4, {"eos_token_id": 9})
    assert mc4.rope_theta == mc5.rope_theta == 10000.0 and mc4.dtype == mc5.dtype == "float32"
    assert mc4.eos_token_ids == [mc5.eos_token_ids[0], 7, 9]
    # the published config.json of real models, as shipped for the benchmarks (minivllm/entrypoints/bench/configs)
    for name in ("qwen3-0.6b", "qwen3-8b", "qwen3-32b", "llama-3.1-8b-instruct"):
        path, _ = resolve_model(name)
        cfg = read_config(path)
        mc = arch_from_dict(cfg)
        assert mc.head_dim == 128 and mc.dtype == "bfloat16" and mc.eos_token_ids


def test_core_and_config_do_not_import_torch_or_numpy():
    """The scheduler's bookkeeping and the config are pure Python: importing them loads neither torch nor
    numpy (a fresh interpreter, so nothing else imported them first)."""
    code = ("import sys, minivllm.core.sequence, minivllm.core.block_manager, minivllm.core.scheduler, "
            "minivllm.core.scheduler_output, minivllm.config; "
            "bad = sorted({'torch', 'numpy'} & set(sys.modules)); assert not bad, f'imported {bad}'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_ids_past_the_tokenizer_vocab_decode_to_nothing(llm):
    n = len(llm.get_tokenizer())
    assert llm.engine.config.model_config.arch.vocab_size > n  # the model's vocab is larger, as in Qwen3
    assert llm.engine.decode([5, n, llm.engine.config.model_config.arch.vocab_size - 1, 6]) == llm.engine.decode([5, 6])
    out = llm.generate([[5, 6, n + 1]], OK, use_tqdm=False)[0]  # such ids are valid prompt tokens
    assert len(out["token_ids"]) == 4 and isinstance(out["text"], str)


def test_triton_on_the_cpu_needs_the_interpreter(monkeypatch, llm):
    """Triton kernels asked for on the CPU outside the interpreter: a clear error, not Triton's
    "0 active drivers" from inside the first step. The fused sampler runs where Triton kernels do."""
    from minivllm.envs import Envs

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="attention_backend='triton' on the CPU needs TRITON_INTERPRET=1"):
        create(attention_backend="triton")
    with pytest.raises(ValueError, match="attention_backend='triton' on the CPU needs TRITON_INTERPRET=1"):
        Config(ModelConfig("x", ARCH), device_config=DeviceConfig("cpu", "triton"), envs=Envs(triton_interpret=False))
    cpu = create()
    assert cpu.device_config.attention_backend == "torch" and not cpu.device_config.triton_sampling
    assert DeviceConfig(device="cuda").attention_backend == "triton" and DeviceConfig(device="cuda").triton_sampling
    assert DeviceConfig(device="cuda", attention_backend="torch").triton_sampling
    assert llm.engine.executor.runner.sampler.fused is False  # the CPU with the torch backend: no Triton sampler
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    interpreted = create(attention_backend="triton")
    assert interpreted.envs.triton_interpret and interpreted.device_config.triton_sampling


# ------------------------------------------------------------------ the command line


def _serve_parser_flags() -> dict[str, argparse.Action]:
    from minivllm.entrypoints.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {opt: action for action in sub.choices["serve"]._actions for opt in action.option_strings}


def test_every_engine_argument_has_a_cli_flag():
    from minivllm.entrypoints.args import engine_flags

    flags = engine_flags()
    names = [name for _, name, _, _ in flags]
    assert sorted(names) == sorted(Config.engine_arg_names()) and len(set(names)) == len(names)
    serve = _serve_parser_flags()
    for flag, name, _, meta in flags:
        assert flag == "--" + name.replace("_", "-") and meta["help"], name
        assert serve[flag].dest == name and serve[flag].default is None, flag  # None: the engine's default


def test_boolean_flags_have_a_no_form_only_when_on_by_default():
    from minivllm.entrypoints.args import engine_flags

    serve = _serve_parser_flags()
    bools = {name: meta["default"] for flag, name, typ, meta in engine_flags() if typ is None}
    assert {"enable_prefix_caching", "enable_chunked_prefill", "async_scheduling", "enforce_eager",
            "disable_custom_all_reduce"} <= set(bools)
    for name, default in bools.items():
        flag = "--" + name.replace("_", "-")
        no = "--no-" + name.replace("_", "-")
        assert flag in serve
        assert (no in serve) == (default is not False), (name, default)
        assert default in (False, True, None), (name, default)


def test_serve_help_lists_every_engine_flag(capsys):
    from minivllm.entrypoints import cli
    from minivllm.entrypoints.args import engine_flags

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["serve", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "usage: minivllm serve" in text and "model" in text
    for flag, name, typ, meta in engine_flags():
        assert flag in text, flag
        if typ is None:
            assert ("--no-" + name.replace("_", "-") in text) == (meta["default"] is not False), flag


def test_flags_parse_to_engine_arguments(tiny_tied_model):
    from minivllm.entrypoints.args import engine_kwargs
    from minivllm.entrypoints.cli import build_parser

    parse = build_parser().parse_args
    assert engine_kwargs(parse(["serve", tiny_tied_model])) == {}
    args = parse(["serve", tiny_tied_model, "--device", "cpu", "--max-num-seqs", "4", "--gpu-memory-utilization",
                  "0.5", "--no-enable-prefix-caching", "--enforce-eager", "--async-scheduling", "-tp", "1",
                  "--kv-cache-dtype", "fp8", "--cpu-threads", "2"])
    kw = engine_kwargs(args)
    assert kw == dict(device="cpu", max_num_seqs=4, gpu_memory_utilization=0.5, enable_prefix_caching=False,
                      enforce_eager=True, async_scheduling=True, tensor_parallel_size=1, kv_cache_dtype="fp8",
                      cpu_threads=2)
    cfg = Config.create(args.model, **kw)
    assert not cfg.cache_config.enable_prefix_caching and cfg.scheduler_config.max_num_seqs == 4
    assert engine_kwargs(parse(["serve", tiny_tied_model, "--no-async-scheduling"])) == {"async_scheduling": False}


@pytest.mark.parametrize("argv", [["serve", "--enforce-eager"], ["serve", "m", "--no-enforce-eager"],
                                  ["serve", "m", "--kv-cache-dtype", "fp4"], ["serve", "m", "--max-num-seqs", "2.5"]])
def test_bad_command_lines_exit_2(argv, capsys):
    from minivllm.entrypoints import cli

    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "usage: minivllm" in err


@pytest.mark.parametrize("command", [["serve"], ["generate", "--prompt", "x"]])
def test_cli_requires_the_model_folder(command, tmp_path, capsys):
    """No default model: ``minivllm serve`` / ``generate`` without MODEL is a usage error, and a folder
    that does not exist a clear message before anything loads."""
    from minivllm.entrypoints import cli

    with pytest.raises(SystemExit) as exit_info:
        cli.main(command)
    assert exit_info.value.code == 2 and "model" in capsys.readouterr().err
    missing = str(tmp_path / "no-such-model")
    with pytest.raises(SystemExit, match=f"model folder not found: {missing}"):
        cli.main([command[0], missing, *command[1:]])


def test_generate_command_runs(tiny_tied_model, capsys):
    from minivllm.entrypoints import cli

    greedy = SamplingParams(temperature=0, max_tokens=5)
    with LLM(tiny_tied_model, device="cpu", max_model_len=64) as llm:
        expected = llm.generate(["def f(", "x ="], greedy, use_tqdm=False)
    assert cli.main(["generate", tiny_tied_model, "--prompt", "def f(", "--prompt", "x =", "--max-tokens", "5",
                     "--temperature", "0", "--device", "cpu", "--max-model-len", "64"]) == 0
    out = capsys.readouterr().out
    assert out == f"--- 0\ndef f({expected[0]['text']}\n--- 1\nx ={expected[1]['text']}\n"
