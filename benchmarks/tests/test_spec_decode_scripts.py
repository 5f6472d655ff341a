"""Smoke tests of benchmarks/spec_decode/ (ngram_acceptance.py, model_proposers.py) on the CPU with tiny sizes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_ngram_acceptance_runs_and_checks_outputs(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("ngram_acceptance",
                                                  ROOT / "benchmarks" / "spec_decode" / "ngram_acceptance.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = mod.main(["--k", "2", "--num-prompts", "2", "--prompt-len", "48", "--output-len", "12",
                     "--json-out", str(tmp_path / "n.json")])
    assert [r["k"] for r in rows] == [0, 2] and rows[1]["num_draft_tokens"] >= rows[1]["num_accepted_tokens"]
    assert all(r["output_tok_s"] > 0 for r in rows) and (tmp_path / "n.json").exists()
    assert "mean len" in capsys.readouterr().out


@pytest.mark.slow
def test_model_proposers_runs_and_checks_outputs(tmp_path, capsys):
    """The demo model as its own draft: every draft accepted, outputs equal (the script checks them)."""
    spec = importlib.util.spec_from_file_location("model_proposers",
                                                  ROOT / "benchmarks" / "spec_decode" / "model_proposers.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = mod.main(["--method", "draft_model", "--k", "2", "--num-prompts", "2", "--prompt-len", "48",
                     "--output-len", "12", "--json-out", str(tmp_path / "m.json")])
    assert [r["k"] for r in rows] == [0, 2] and rows[1]["num_draft_tokens"] == rows[1]["num_accepted_tokens"] > 0
    assert (tmp_path / "m.json").exists() and "draft_model" in capsys.readouterr().out
