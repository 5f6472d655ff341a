"""benchmarks/lib/reference.py: vLLM 0.24.0's reference figures and the targets beside which the GPU runs'
results are printed."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _reference():
    spec = importlib.util.spec_from_file_location("bench_reference", ROOT / "benchmarks" / "lib" / "reference.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # NOTE: its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_reference_table():
    reference = _reference()

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
