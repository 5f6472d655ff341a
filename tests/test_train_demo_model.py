"""End-to-end check of scripts/train_demo_model.py on a tiny config (CPU, one thread, a few seconds: the slow
tier)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "train_demo_model.py"
TINY_ARGS = [
    "--device", "cpu", "--threads", "1", "--seed", "0",
    "--max-files", "8", "--max-steps", "6", "--minutes", "0",
    "--vocab-size", "300", "--hidden-size", "32", "--layers", "2", "--heads", "4", "--kv-heads", "2",
    "--head-dim", "8", "--intermediate-size", "64", "--seq-len", "32", "--batch-size", "4",
    "--warmup-steps", "2", "--log-every", "2", "--eval-every", "3", "--eval-windows", "8",
    "--sample-tokens", "8",
]  # fmt: skip


def load_script():
    """Import the script as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("train_demo_model", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def run_tiny(out: Path) -> dict:
    """Run the script's main() on the tiny config, restoring torch's thread count afterwards."""
    threads = torch.get_num_threads()
    try:
        return load_script().main(["--out", str(out), *TINY_ARGS])
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "minivllm-demo-tiny"
    return out, run_tiny(out)


def test_folder_has_all_files(trained):
    out, log = trained
    for name in (
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "README.md",
        "train_log.json",
        "loss_curve.png",
    ):
        assert (out / name).is_file(), name
    assert (out / "loss_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert log["folder_mb"] < 40
    card = (out / "README.md").read_text()
    assert log["python_version_short"] in card and "unigram" in card


def test_config_and_model_load(trained):
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    out, _ = trained
    tok = AutoTokenizer.from_pretrained(out)
    cfg = AutoConfig.from_pretrained(out)
    assert cfg.model_type == "qwen3" and cfg.tie_word_embeddings
    assert cfg.dtype == torch.bfloat16
    assert cfg.eos_token_id == tok.eos_token_id == tok.pad_token_id
    assert cfg.vocab_size % 64 == 0 and cfg.vocab_size >= len(tok)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (4, 2, 8)
    with safe_open(out / "model.safetensors", "pt") as f:
        assert all(f.get_slice(k).get_dtype() == "BF16" for k in f.keys())
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    logits = model(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, cfg.vocab_size) and torch.isfinite(logits).all()


def test_tokenizer_round_trip_and_chat_template(trained):
    from transformers import AutoTokenizer

    out, _ = trained
    tok = AutoTokenizer.from_pretrained(out)
    text = "def f(x):\n    return x"
    assert tok.decode(tok(text)["input_ids"]) == text
    assert tok.eos_token == "<|endoftext|>" and tok.bos_token is None
    for special in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        assert len(tok(special)["input_ids"]) == 1
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_losses_and_baseline_reported(trained):
    out, log = trained
    on_disk = json.loads((out / "train_log.json").read_text())
    assert on_disk["training"]["steps"] == log["training"]["steps"] == 6
    assert [h["step"] for h in on_disk["training"]["history"]] == [2, 4, 6]
    assert [e["step"] for e in on_disk["training"]["periodic_evals"]] == [3, 6]
    losses = [h["loss"] for h in on_disk["training"]["history"]]
    losses += [on_disk["eval"][k] for k in ("heldout_loss", "train_window_loss", "unigram_baseline")]
    assert all(math.isfinite(v) and v > 0 for v in losses)
    # the untrained-ish model is near uniform over the model vocab; the baseline is below that
    assert on_disk["eval"]["unigram_baseline"] < math.log(on_disk["model"]["model_vocab"])
    assert len(on_disk["samples"]) == 4


def test_same_seed_same_weights(trained, tmp_path):
    out, _ = trained
    again = tmp_path / "again"
    run_tiny(again)
    assert (again / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()
    assert (again / "tokenizer.json").read_bytes() == (out / "tokenizer.json").read_bytes()
