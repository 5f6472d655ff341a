"""Bad LoRA inputs are ValueErrors naming the problem, before anything is queued: the folder, its
adapter_config.json, its tensors, the rank, the target modules, LoRA not enabled; and the LoRA flags."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from minivllm import LLM, LoRARequest, SamplingParams
from minivllm.config import Config
from minivllm.config.hf import load_arch
from minivllm.lora.checkpoint import check_adapter
from tests.helpers.lora_adapters import ALL_SEVEN, ATTENTION, build_lora_adapter, edit_adapter_config


@pytest.fixture(scope="module")
def good_adapter(tiny_tied_model, tmp_path_factory) -> Path:
    return build_lora_adapter(tiny_tied_model, tmp_path_factory.mktemp("good-lora"), ALL_SEVEN, r=8, alpha=16)


@pytest.fixture
def adapter_copy(good_adapter, tmp_path) -> Path:
    """A copy of the good adapter to break."""
    return Path(shutil.copytree(good_adapter, tmp_path / "adapter"))


def check(model: str, path: Path, max_lora_rank: int = 16):
    return check_adapter(LoRARequest("x", 1, str(path)), load_arch(model), max_lora_rank)


def test_a_good_adapter_is_read(tiny_tied_model, good_adapter):
    adapter = check(tiny_tied_model, good_adapter)
    assert adapter.rank == 8 and adapter.scaling == 2.0
    assert adapter.target_modules == frozenset(ALL_SEVEN)
    assert len(adapter.modules) == 2 * 7  # two layers


@pytest.mark.parametrize("change, match", [
    (dict(r=None), "r must be an integer"),
    (dict(r=0), "r must be an integer"),
    (dict(lora_alpha="big"), "lora_alpha must be a number"),
    (dict(peft_type="IA3"), "peft_type 'IA3' is not supported"),
    (dict(use_dora=True), "use_dora=True is not supported"),
    (dict(bias="all"), "bias='all' is not supported"),
    (dict(lora_bias=True), "lora_bias=True is not supported"),
    (dict(rank_pattern={"q_proj": 4}), "rank_pattern=.* is not supported"),
    (dict(alpha_pattern={"q_proj": 3}), "alpha_pattern=.* is not supported"),
    (dict(target_modules=["q_proj", "embed_tokens"]), "unsupported target module.*embed_tokens"),
    (dict(target_modules="q_proj|v_proj"), "target_modules as a pattern"),
    (dict(target_modules=[]), "target_modules must be a non-empty list"),
])
def test_bad_adapter_config_is_named(tiny_tied_model, adapter_copy, change, match):
    edit_adapter_config(adapter_copy, **change)
    with pytest.raises(ValueError, match=match):
        check(tiny_tied_model, adapter_copy)


def test_unreadable_or_missing_files_are_named(tiny_tied_model, adapter_copy, tmp_path):
    with pytest.raises(ValueError, match="lora_path is not a folder"):
        check(tiny_tied_model, tmp_path / "nowhere")
    (adapter_copy / "adapter_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="adapter_config.json is not valid JSON"):
        check(tiny_tied_model, adapter_copy)
    (adapter_copy / "adapter_config.json").unlink()
    with pytest.raises(ValueError, match="adapter_config.json is missing"):
        check(tiny_tied_model, adapter_copy)


def test_bad_weights_are_named(tiny_tied_model, good_adapter, tmp_path):
    broken = Path(shutil.copytree(good_adapter, tmp_path / "a"))
    (broken / "adapter_model.safetensors").unlink()
    with pytest.raises(ValueError, match="adapter_model.safetensors is missing"):
        check(tiny_tied_model, broken)
    (broken / "adapter_model.safetensors").write_bytes(b"\x01")
    with pytest.raises(ValueError, match="not a safetensors file"):
        check(tiny_tied_model, broken)


def test_rank_above_max_lora_rank_is_refused(tiny_tied_model, good_adapter):
    with pytest.raises(ValueError, match="rank r=8 exceeds max_lora_rank=4"):
        check(tiny_tied_model, good_adapter, max_lora_rank=4)


def test_adapter_of_another_model_or_module_is_refused(tiny_tied_model, tiny_untied_model, tiny_moe_model,
                                                       good_adapter, tmp_path):
    with pytest.raises(ValueError, match="has shape .* expected"):  # another base model's shapes
        check(tiny_untied_model, good_adapter)
    head = build_lora_adapter(tiny_tied_model, tmp_path / "head", ["lm_head"], r=4, alpha=4)
    edit_adapter_config(head, target_modules=["q_proj"])  # the config lies: the tensors say lm_head
    with pytest.raises(ValueError, match="unsupported tensor .*lm_head"):
        check(tiny_tied_model, head)
    # an MLP adapter of a mixture-of-experts layer: the attention adapter plus a gate_proj of a sparse layer
    moe = build_lora_adapter(tiny_moe_model, tmp_path / "moe", ATTENTION, r=4, alpha=4)
    arch = load_arch(tiny_moe_model)
    sparse = next(i for i in range(arch.num_hidden_layers) if arch.is_moe_layer(i))
    tensors = load_file(moe / "adapter_model.safetensors")
    key = f"base_model.model.model.layers.{sparse}.mlp.gate_proj"
    tensors[f"{key}.lora_A.weight"] = torch.zeros(4, arch.hidden_size)
    tensors[f"{key}.lora_B.weight"] = torch.zeros(arch.intermediate_size, 4)
    save_file(tensors, moe / "adapter_model.safetensors")
    with pytest.raises(ValueError, match=f"gate_proj of layer {sparse}: a mixture-of-experts MLP cannot take"):
        check(tiny_moe_model, moe)


def test_engine_refuses_bad_requests_before_queueing(tiny_tied_model, good_adapter, tmp_path):
    lora = LoRARequest("good", 1, str(good_adapter))
    with LLM(tiny_tied_model, device="cpu") as llm:  # LoRA not enabled
        with pytest.raises(ValueError, match="lora_request .* LoRA is not enabled.*enable_lora"):
            llm.generate("x", use_tqdm=False, lora_request=lora)
        assert not llm.engine.has_unfinished_requests()
    with LLM(tiny_tied_model, device="cpu", enable_lora=True, max_lora_rank=4) as llm:
        with pytest.raises(ValueError, match="exceeds max_lora_rank=4"):
            llm.generate(["x", "y"], use_tqdm=False, lora_request=[None, lora])
        with pytest.raises(ValueError, match="lora_path is not a folder"):
            llm.add_lora(LoRARequest("missing", 2, str(tmp_path / "missing")))
        with pytest.raises(ValueError, match="lora_request: got 1 for 2 prompts"):
            llm.generate(["x", "y"], use_tqdm=False, lora_request=[None])
        with pytest.raises(ValueError, match="lora_request must be a LoRARequest"):
            llm.generate("x", use_tqdm=False, lora_request="good")
        with pytest.raises(ValueError, match="lora_request / sampling_params: got 1 / 2 for 2 prompts"):
            llm.engine.run_batch(["x", "y"], [SamplingParams()] * 2, use_tqdm=False, lora_requests=[None])
        with pytest.raises(ValueError, match="lora_request must be a LoRARequest, got None"):
            llm.engine.add_lora(None)
        assert not llm.engine.has_unfinished_requests() and llm.list_loras() == set()
        assert llm.generate("x", SamplingParams(max_tokens=2), use_tqdm=False)[0]["token_ids"]  # still works


def test_lora_config_fields_and_flags(tiny_tied_model):
    cfg = Config.create(tiny_tied_model, device="cpu", enable_lora=True, max_loras=3)
    assert cfg.lora_config.max_cpu_loras == 3 and cfg.lora_config.max_lora_rank == 16
    for kw, match in ((dict(max_loras=0), "max_loras must be >= 1"),
                      (dict(max_loras=4, max_cpu_loras=2), r"max_cpu_loras \(2\) must be >= max_loras \(4\)"),
                      (dict(max_lora_rank="8"), "max_lora_rank must be an int")):
        with pytest.raises(ValueError, match=match):
            Config.create(tiny_tied_model, device="cpu", enable_lora=True, **kw)
    with pytest.raises(ValueError, match="enable_lora: LoRA adapters need the model's weights unquantized"):
        Config.create(tiny_tied_model, device="cpu", enable_lora=True, quantization="fp8")
    from minivllm.entrypoints.args import engine_flags

    flags = {f for f, *_ in engine_flags()}
    assert {"--enable-lora", "--max-loras", "--max-lora-rank", "--max-cpu-loras"} <= flags

