"""End-to-end check of scripts/train_eagle3_head.py on a tiny run (CPU, a few training steps, a small evaluation:
the slow tier): it writes a head in the published format that the engine's loader reads, and its acceptance
table."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from minivllm.models.eagle3 import Eagle3LlamaForCausalLM
from minivllm.models.eagle3_loader import load_eagle3_config, load_eagle3_weights

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "train_eagle3_head.py"
TINY_ARGS = ["--threads", "1", "--max-files", "6", "--max-steps", "2", "--minutes", "0", "--seq-len", "32",
             "--batch-size", "2", "--ttt-steps", "3", "--warmup-steps", "1", "--draft-vocab-size", "512",
             "--intermediate-size", "64", "--eval-prompts", "2", "--prompt-len", "16", "--gen-len", "12",
             "--max-k", "3"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    spec = importlib.util.spec_from_file_location("train_eagle3_head", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    out = tmp_path_factory.mktemp("eagle3") / "head"
    threads = torch.get_num_threads()
    try:
        return out, module.main(["--out", str(out), *TINY_ARGS])
    finally:
        torch.set_num_threads(threads)


def test_writes_a_loadable_head(trained):
    out, result = trained
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.safetensors",
                                                     "train_log.json"]
    cfg = load_eagle3_config(str(out))
    assert cfg.draft_vocab_size == 512 and cfg.aux_layers == (1, 3, 5) and cfg.arch.intermediate_size == 64
    head = Eagle3LlamaForCausalLM(cfg)
    assert load_eagle3_weights(head, str(out)) is False  # the embedding stays the target's
    assert json.loads((out / "train_log.json").read_text())["training"]["steps"] == result["training"]["steps"] == 2


def test_reports_acceptance_per_k(trained):
    out, result = trained
    ev = result["evaluation"]
    assert ev["num_sequences"] >= 1 and ev["generated_tokens"] > 0  # --max-files 6: one held-out file
    for method in ("eagle3", "ngram"):
        assert sorted(ev[method]) == [1, 2, 3]
        for k, row in ev[method].items():
            assert row["steps"] > 0 and 0.0 <= row["acceptance_rate"] <= 1.0
            assert 1.0 <= row["mean_acceptance_length"] <= 1 + k
            assert row["accepted"] <= row["drafted"] <= k * row["steps"]
    readme = (out / "README.md").read_text()
    assert "| k | EAGLE-3 acceptance rate" in readme and "python scripts/train_eagle3_head.py" in readme
