"""Smoke tests of the benchmark commands: each runs end to end on the CPU with tiny sizes.

No timing assertions: only that the result table is printed and the JSON fields are positive.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minivllm.entrypoints.bench import add_bench_parser, latency, serve, throughput
from minivllm.entrypoints.bench.models import resolve_model, shipped_models

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--device", "cpu", "--max-model-len", "256", "--num-kvcache-blocks", "64"]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def dummy_dir(tmp_path_factory) -> str:
    """A folder with only a tiny Qwen3 config.json: dummy weights, no tokenizer."""
    d = tmp_path_factory.mktemp("dummy-qwen3")
    cfg = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 512, "hidden_size": 64,
           "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 16, "max_position_embeddings": 1024, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
           "tie_word_embeddings": True, "torch_dtype": "float32", "eos_token_id": 1, "bos_token_id": 0}
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


def _positive(d: dict, *keys: str) -> None:
    for k in keys:
        assert isinstance(d[k], (int, float)) and d[k] > 0, (k, d[k])


def test_resolve_model(dummy_dir, tiny_tied_model):
    assert {"qwen3-0.6b", "qwen3-8b", "qwen3-32b", "llama-3.1-8b", "tiny-qwen3"} <= set(shipped_models())
    path, hint = resolve_model("Qwen/Qwen3-0.6B")
    assert hint == "dummy" and json.loads((Path(path) / "config.json").read_text())["hidden_size"] == 1024
    assert resolve_model(dummy_dir) == (dummy_dir, "dummy")
    assert resolve_model(tiny_tied_model) == (tiny_tied_model, None)
    with pytest.raises(ValueError):
        resolve_model("no-such-model")


def test_reference_table():
    from minivllm.entrypoints.bench import reference

    ref = reference.lookup("NVIDIA H100 80GB HBM3", 1, "qwen3-0.6b", "fixed-batch")
    assert (ref.vllm, ref.target, ref.transformers) == (30066, 33000, 2968)
    assert ref.met(33000) and not ref.met(32999) and ref.speedup(30066) == 1.0
    lat = reference.lookup("NVIDIA H200", 1, "qwen3-0.6b", "one-request")
    assert lat.unit == "ms/token" and lat.met(1.4) and not lat.met(1.6) and lat.speedup(0.825) == 2.0
    assert reference.lookup("NVIDIA H100 80GB HBM3", 1, "qwen3-0.6b", "one-request").vllm_range == (1.68, 1.80)
    assert reference.lookup("NVIDIA H200", 2, "qwen3-8b", "nano").target == 15500
    assert reference.lookup("NVIDIA A100", 1, "qwen3-0.6b", "nano") is None
    rows = dict((r[0], r[1]) for r in reference.comparison_rows(ref, 36000.0))
    assert rows["target met"] == "yes" and rows["speedup vs transformers"] > 12


@pytest.mark.parametrize("workload", ["nano", "fixed-batch", "one-request"])
def test_throughput_workloads(workload, dummy_dir, tmp_path, capsys):
    out = tmp_path / "t.json"
    res = throughput.main(["--workload", workload, "--model", dummy_dir, "--num-requests", "3",
                           "--min-input-len", "8", "--max-input-len", "16", "--min-output-len", "4",
                           "--max-output-len", "8", "--json-out", str(out), *TINY])
    text = capsys.readouterr().out
    assert "== throughput results ==" in text and "output tok/s" in text
    saved = json.loads(out.read_text())
    for d in (res, saved):
        _positive(d, "requests_per_s", "output_tok_s", "total_tok_s", "elapsed_s", "ms_per_token")
        assert d["num_requests"] == 3 and d["sizes_overridden"] and d["reference"] is None
    if workload == "one-request":
        assert "ms per output token" in text


def test_throughput_real_checkpoint_repeat(tiny_tied_model, capsys):
    res = throughput.main(["--workload", "fixed-batch", "--model", tiny_tied_model, "--num-requests", "4",
                           "--input-len", "12", "--output-len", "6", "--repeat", "2", *TINY, "--kv-cache-dtype", "fp8"])
    assert len(res["runs"]) == 2 and res["total_output_tokens"] == 24
    assert res["engine_args"]["kv_cache_dtype"] == "fp8"
    _positive(res, "output_tok_s")
    assert "all runs (output_tok_s)" in capsys.readouterr().out


def test_latency(tiny_tied_model, tmp_path, capsys):
    out = tmp_path / "l.json"
    res = latency.main(["--model", tiny_tied_model, "--batch-size", "3", "--input-len", "10", "--output-len", "5",
                        "--num-iters", "2", "--num-iters-warmup", "1", "--json-out", str(out), *TINY,
                        "--async-scheduling"])  # the GPU default: tokens reach the host a step late
    text = capsys.readouterr().out
    assert "== latency results ==" in text and "TTFT (ms)" in text and "TPOT (ms)" in text
    saved = json.loads(out.read_text())
    assert saved["engine_args"]["async_scheduling"] is True
    for key in ("ttft_ms", "tpot_ms", "itl_ms"):
        _positive(saved[key], "mean", "median", "p99")
    _positive(res["e2e_latency_s"], "median", "p99")


def test_cli_parser_dispatch(dummy_dir, capsys):
    parser = argparse.ArgumentParser(prog="minivllm")
    add_bench_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "throughput", "--workload", "one-request", "--model", dummy_dir,
                              "--input-len", "8", "--output-len", "4", *TINY])
    assert args.func(args) == 0
    assert "ms per output token" in capsys.readouterr().out
    args = parser.parse_args(["bench"])
    assert args.func(args) == 2


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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.server
def test_serve_against_minivllm_server(tiny_tied_model, tmp_path, capsys):
    for mod in ("minivllm.entrypoints.openai_server", "minivllm.entrypoints.cli"):
        try:
            importlib.import_module(mod)
        except ImportError as e:
            pytest.skip(f"{mod} is not importable yet ({e}); `bench serve` needs the real `minivllm serve`")
    port = _free_port()
    cmd = [sys.executable, "-m", "minivllm.entrypoints.cli", "serve", tiny_tied_model, "--host", "127.0.0.1",
           "--port", str(port), *TINY]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    try:
        import httpx

        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                pytest.fail(f"`minivllm serve` exited with {proc.returncode}:\n{proc.stdout.read()[-3000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "server did not come up in 120 s"
            time.sleep(0.5)
        out = tmp_path / "s.json"
        res = serve.main(["--base-url", f"http://127.0.0.1:{port}", "--num-prompts", "4", "--input-len", "8",
                          "--output-len", "6", "--request-rate", "20", "--token-ids", "--max-token-id", "300",
                          "--json-out", str(out)])
        assert "== serving results ==" in capsys.readouterr().out
        saved = json.loads(out.read_text())
        assert saved["completed"] == 4 and saved["failed"] == 0, saved["errors"]
        _positive(saved, "request_throughput", "output_throughput", "mean_ttft_ms", "median_tpot_ms", "p99_itl_ms")
        assert res["total_output_tokens"] == 24
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
