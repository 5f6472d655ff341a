"""benchmarks/engine/rank_proxy.py: one rank's shapes as a config, and tp_scaling.py --rank-proxy end to end (CPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "engine"))

from rank_proxy import overhead_table, rank_config  # noqa: E402


def _config(name: str) -> dict:
    from minivllm.entrypoints.bench.models import resolve_model

    folder = ROOT / "benchmarks" / "engine" / "configs" / name
    if not folder.is_dir():  # a config shipped with the package
        folder = Path(resolve_model(name)[0])
    return json.loads((folder / "config.json").read_text())


def test_rank_config_of_qwen3_8b_is_the_shipped_tp2_rank_config():
    got = rank_config(_config("qwen3-8b"), 2)
    want = _config("qwen3-8b-tp2-rank")
    keys = ("num_attention_heads", "num_key_value_heads", "intermediate_size", "vocab_size", "head_dim",
            "hidden_size", "num_hidden_layers", "bos_token_id", "eos_token_id")
    assert {k: got[k] for k in keys} == {k: want[k] for k in keys}
    assert (got["num_attention_heads"], got["num_key_value_heads"], got["intermediate_size"]) == (16, 4, 6144)


def test_rank_config_replicates_kv_heads_and_keeps_head_dim():
    cfg = {"num_attention_heads": 32, "num_key_value_heads": 2, "intermediate_size": 8192, "vocab_size": 1024,
           "hidden_size": 4096}  # no head_dim: HF derives it from hidden / heads
    got = rank_config(cfg, 4)
    assert (got["num_attention_heads"], got["num_key_value_heads"], got["head_dim"]) == (8, 1, 128)
    assert got["eos_token_id"] < got["vocab_size"] == 256
    with pytest.raises(ValueError, match="vocab_size = 1024 does not split over 3 ranks"):
        rank_config({**cfg, "num_attention_heads": 96, "intermediate_size": 24576}, 3)
    with pytest.raises(ValueError, match="num_key_value_heads = 6"):
        rank_config({**cfg, "num_key_value_heads": 6}, 4)


def test_rank_config_of_a_moe_model_splits_every_expert():
    """Qwen3-30B-A3B at TP=2: each rank holds every expert, with half of its intermediate dimension; the expert
    count and top-k stay."""
    cfg = _config("qwen3-30b-a3b")
    got = rank_config(cfg, 2)
    assert (got["moe_intermediate_size"], got["intermediate_size"]) == (384, cfg["intermediate_size"] // 2)
    assert (got["num_experts"], got["num_experts_per_tok"]) == (128, 8)
    with pytest.raises(ValueError, match="moe_intermediate_size = 768 does not split over 5 ranks"):
        rank_config({**cfg, "num_attention_heads": 40, "intermediate_size": 6400, "vocab_size": 151680}, 5)
    mixtral = rank_config({"num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
                           "vocab_size": 32000, "hidden_size": 4096, "num_local_experts": 8}, 4)
    assert (mixtral["intermediate_size"], mixtral["num_local_experts"]) == (3584, 8)
    assert "moe_intermediate_size" not in mixtral


def test_overhead_table():
    tp = {"tp": 2, "throughput_elapsed_s": 9.0, "step_breakdown": [
        {"kind": "with prefill", "steps": 9, "seconds": 1.8}, {"kind": "decode 1-16 rows", "steps": 50, "seconds": 0.2}]}
    proxy = {"tp": 1, "throughput_elapsed_s": 7.5, "step_breakdown": [{"kind": "with prefill", "steps": 9, "seconds": 1.5}]}
    text = overhead_table(tp, proxy)
    assert "with prefill" in text and "0.300" in text and "33.33" in text  # 0.3 s over 9 steps
    assert "whole run" in text and "1.500" in text


@pytest.mark.slow
def test_tp_scaling_rank_proxy_on_cpu(tmp_path):
    out = tmp_path / "tp.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "engine" / "tp_scaling.py"), "--model", "tiny-qwen3",
           "--device", "cpu", "--tp", "2", "--rank-proxy", "--num-seqs", "2", "--max-input-len", "100",
           "--max-output-len", "100", "--latency-input-len", "4", "--latency-output-len", "4", "--size-timeout", "240",
           "--json-out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "TP=2 against one rank's compute" in proc.stdout and "whole run" in proc.stdout
    data = json.loads(out.read_text())
    proxy = data["rank_proxy"]["2"]
    assert "error" not in data["results"][0] and "error" not in proxy, data
    assert proxy["tp"] == 1 and proxy["output_tokens"] == data["results"][0]["output_tokens"]
