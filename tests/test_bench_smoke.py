"""Smoke tests of the benchmark commands (``minivllm bench``): each runs end to end on the CPU with tiny sizes.
``bench serve`` runs in tests/test_server.py, against that module's server.

No timing assertions: only that the result table is printed and the JSON fields are positive.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import shlex
import sys
from pathlib import Path

import pytest

import minivllm
from minivllm.engine import progress
from minivllm.entrypoints import cli
from minivllm.entrypoints.bench import latency, throughput
from minivllm.entrypoints.bench.commands import add_bench_parser
from minivllm.entrypoints.bench.models import CONFIGS_DIR, resolve_model, shipped_models

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--device", "cpu", "--max-model-len", "256", "--num-kvcache-blocks", "64"]


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
    assert Path(path).parent == CONFIGS_DIR and CONFIGS_DIR.is_relative_to(Path(minivllm.__file__).parent)
    assert resolve_model("tiny-qwen3") == (str(CONFIGS_DIR / "tiny-qwen3"), "dummy")
    assert resolve_model(dummy_dir) == (dummy_dir, "dummy")
    assert resolve_model(tiny_tied_model) == (tiny_tied_model, None)
    with pytest.raises(ValueError):
        resolve_model("no-such-model")


@pytest.mark.parametrize("workload", ["nano", "fixed-batch", "one-request"])
def test_throughput_workloads(workload, dummy_dir, tmp_path, capsys):
    out = tmp_path / "t.json"
    res = throughput.main(["--workload", workload, "--model", dummy_dir, "--num-requests", "3",
                           "--min-input-len", "8", "--max-input-len", "16", "--min-output-len", "4",
                           "--max-output-len", "8", "--json-out", str(out), *TINY])
    captured = capsys.readouterr()
    text = captured.out
    assert "== throughput results ==" in text and "output tok/s" in text
    assert "Processed prompts" not in captured.err  # stderr is not a terminal: no progress bar
    saved = json.loads(out.read_text())
    for d in (res, saved):
        _positive(d, "requests_per_s", "output_tok_s", "total_tok_s", "elapsed_s", "ms_per_token")
        assert d["num_requests"] == 3 and d["sizes_overridden"]
        assert d["version"] == minivllm.__version__ and "commit" not in d and "reference" not in d
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
    assert saved["engine_args"]["async_scheduling"] is True and saved["version"] == minivllm.__version__
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


class FakeTerminal(io.StringIO):
    """A stand-in for stderr that says it is a terminal, where progress bars are drawn."""

    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("command, bar", [(throughput, "Processed prompts"), (latency, "Timed iterations")])
def test_progress_bars_on_a_terminal_unless_disabled(command, bar, dummy_dir, monkeypatch, capsys):
    sizes = (["--workload", "fixed-batch", "--num-requests", "3", "--input-len", "8", "--output-len", "4"]
             if command is throughput else ["--batch-size", "2", "--input-len", "8", "--output-len", "3",
                                             "--num-iters", "2", "--num-iters-warmup", "1"])
    for flags in ([], ["--disable-tqdm"]):
        terminal = FakeTerminal()
        monkeypatch.setattr(sys, "stderr", terminal)
        command.main(["--model", dummy_dir, *sizes, *TINY, *flags])
        assert (bar in terminal.getvalue()) == (not flags), terminal.getvalue()
        if command is latency and not flags:
            assert "Warm-up iterations" in terminal.getvalue() and "2/2" in terminal.getvalue()
    assert "==" in capsys.readouterr().out  # the tables, on stdout


def test_progress_bar_redrawn_while_no_prompt_finishes(dummy_dir, monkeypatch):
    """One request of 24 tokens stays at 0/1 until its last step; the bar is still redrawn with its rates (every
    step here, REDRAW_S being 0), so a long fixed-size run does not look frozen."""
    monkeypatch.setattr(progress, "REDRAW_S", 0.0)
    terminal = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    throughput.main(["--workload", "one-request", "--model", dummy_dir, "--input-len", "8", "--output-len", "24",
                     *TINY])
    frames = [f for f in terminal.getvalue().split("\r") if "Processed prompts" in f and "0/1" in f]
    assert sum("decode=" in f for f in frames) >= 12, terminal.getvalue()
    assert "1/1" in terminal.getvalue()


def test_the_readme_cpu_bench_command_runs(monkeypatch, capsys):
    """The README's benchmark command for the CPU, as written (cut to one short iteration), prints its table."""
    command = re.search(r"`minivllm (bench latency [^`]*)`", (ROOT / "README.md").read_text())
    assert command, "the README shows no CPU benchmark command"
    monkeypatch.chdir(ROOT)  # the README's model path is relative to the checkout
    argv = [*shlex.split(command[1]), "--output-len", "4", "--num-iters", "1", "--num-iters-warmup", "0"]
    assert cli.main(argv) == 0
    assert "== latency results ==" in capsys.readouterr().out


@pytest.mark.parametrize("argv, named", [
    (["latency", "--model", "no-such-model"], "model 'no-such-model'"),
    (["latency", "--batch-size", "0"], "--batch-size: must be an integer >= 1"),
    (["latency", "--num-iters-warmup", "-1"], "--num-iters-warmup: must be an integer >= 0"),
    (["throughput", "--num-requests", "0"], "--num-requests"),
    (["throughput", "--min-input-len", "100", "--max-input-len", "10"], "min_input_len (100) must be <="),
    (["throughput", "--dataset", "no-such-file.jsonl"], "no-such-file.jsonl"),
    (["throughput", "--engine-arg", "no_such_arg=1"], "engine_arg: 'no_such_arg=1'"),
    (["throughput", "--max-num-seqs", "0"], "max_num_seqs"),
    (["serve", "--max-concurrency", "0"], "--max-concurrency"),
    (["serve", "--request-rate", "0"], "request_rate must be > 0"),
    (["serve", "--base-url", "http://127.0.0.1:1", "--ready-timeout", "0"], "did not answer 200"),
])
def test_bad_bench_input_is_one_line_naming_it(argv, named, dummy_dir, tmp_path, monkeypatch, capsys):
    """A bad flag, model, file or server address ends the command with one line that names it, never a
    traceback."""
    monkeypatch.chdir(tmp_path)
    model = [] if argv[0] == "serve" or "--model" in argv else ["--model", dummy_dir, *TINY]
    with pytest.raises(SystemExit) as exit_:
        cli.main(["bench", *argv, *model])
    err = capsys.readouterr().err
    message = exit_.value.code if isinstance(exit_.value.code, str) else err.strip().splitlines()[-1]
    assert named in message and "Traceback" not in err, (message, err)
