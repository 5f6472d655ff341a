"""Smoke tests of the engine benchmark scripts (benchmarks/engine/*.py), each end to end on the CPU with tiny
sizes (the scripts are not part of the package; ``minivllm bench`` is tested in tests/test_bench_smoke.py)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--device", "cpu", "--max-model-len", "256", "--num-kvcache-blocks", "64"]


def _script(name: str):
    """The module of ``benchmarks/engine/<name>.py``."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "benchmarks" / "engine" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def dummy_dir() -> str:
    """The shipped tiny Qwen3 config folder: dummy weights, no tokenizer."""
    from minivllm.entrypoints.bench.models import resolve_model

    return resolve_model("tiny-qwen3")[0]


def _positive(d: dict, *keys: str) -> None:
    for k in keys:
        assert isinstance(d[k], (int, float)) and d[k] > 0, (k, d[k])


def test_hf_baseline_run_ours(dummy_dir, tmp_path, capsys):
    out = tmp_path / "h.json"
    res = _script("hf_baseline").main(["--model", dummy_dir, "--batch-size", "3", "--input-len", "8",
                                       "--output-len", "6", "--run-ours", "--json-out", str(out), *TINY])
    text = capsys.readouterr().out
    assert text.rstrip().splitlines()[-1].startswith("ratio minivllm / transformers")
    saved = json.loads(out.read_text())
    _positive(saved, "hf_output_tok_s", "ours_output_tok_s", "ratio")
    assert res["hf_output_tokens"] == 18


def test_throughput_vs_batch_and_plot(dummy_dir, tmp_path, capsys):
    runs = tmp_path / "runs"
    res = _script("throughput_vs_batch").main(["--model", dummy_dir, "--batch-sizes", "1,2", "--input-len", "8",
                                               "--output-len", "4", "--json-out", str(runs / "tvb.json"), *TINY])
    assert [r["batch_size"] for r in res["results"]] == [1, 2]
    for r in res["results"]:
        _positive(r, "output_tok_s")
    (runs / "serve_a.json").write_text(json.dumps({
        "benchmark": "serve", "label": "m", "request_rate": 2.0, "completed": 4,
        "ttft_ms": {"median": 5.0, "p99": 9.0}, "tpot_ms": {"median": 1.0, "p99": 2.0}}))
    (runs / "serve_b.json").write_text(json.dumps({
        "benchmark": "serve", "label": "m", "request_rate": float("inf"), "completed": 4,
        "ttft_ms": {"median": 8.0, "p99": 12.0}, "tpot_ms": {"median": 1.5, "p99": 3.0}}))
    written = _script("plot").main([str(runs), "--out-dir", str(tmp_path / "plots")])
    assert sorted(Path(w).name for w in written) == ["latency_vs_rate.png", "throughput_vs_batch.png"]
    for w in written:
        assert Path(w).stat().st_size > 1000
    assert "throughput vs batch size" in capsys.readouterr().out


def test_expert_load_counts_every_routed_pick(tmp_path, capsys):
    """Each MoE layer counts top_k picks for every token the model ran: the prompts' and the fed-back outputs'."""
    out = tmp_path / "e.json"
    res = _script("expert_load").main(["--model", "tiny-qwen3-moe", "--num-prompts", "3", "--input-len", "20",
                                       "--output-len", "5", "--per-expert", "--json-out", str(out), *TINY])
    tokens = 3 * 20 + 3 * (5 - 1)  # prompts, then each output but the last fed back once
    assert len(res["layers"]) == 2  # tiny-qwen3-moe: both layers sparse
    for layer in res["layers"]:
        assert layer["tokens_routed"] == sum(layer["per_expert"]) == tokens * 2  # top-2
        assert len(layer["per_expert"]) == 8 and layer["max"] >= tokens * 2 / 8 >= layer["min"]
    assert json.loads(out.read_text())["layers"][0]["per_expert"] == res["layers"][0]["per_expert"]
    assert "max / mean" in capsys.readouterr().out


def test_expert_load_refuses_a_dense_model(dummy_dir):
    with pytest.raises(SystemExit, match="no mixture-of-experts layer"):
        _script("expert_load").main(["--model", dummy_dir, "--num-prompts", "1", "--input-len", "4",
                                     "--output-len", "2", *TINY])
