"""Programmatic dependent launch (PDL) changes when kernels start, never what they compute.

On sm_90+ the kernels launch with PDL when their leading dim is at most ``PDL_MAX_ROWS`` (16); the tests
compare those launches with the same kernels, on the same tensors, launched without PDL: ``_plain_launches``
makes ``pdl_options`` (through which every kernel decides) return ``USE_PDL=False``.

A decoder layer's decode kernels (``benchmarks/kernels/decode_layer.py``: norms, GEMVs, q/k norm + RoPE +
KV store, split-KV attention, SiLU-and-mul) give bit-identical results with PDL and without, eagerly
and replayed in a CUDA graph with new inputs; a kernel that read its input before the previous
kernel had finished would show as a mismatch. The engine (TP=1, in this process) gives the same greedy
tokens both ways.
"""

from __future__ import annotations

import importlib.util
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.kernels import pdl
from minivllm.kernels.pdl import PDL_MAX_ROWS, use_pdl

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
if torch.cuda.is_available() and torch.cuda.get_device_capability() < (9, 0):
    pytestmark.append(pytest.mark.skip(reason="PDL needs compute capability 9.0+"))

_spec = importlib.util.spec_from_file_location(
    "decode_layer", Path(__file__).resolve().parents[2] / "benchmarks" / "kernels" / "decode_layer.py")
decode_layer = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(decode_layer)


@contextmanager
def _plain_launches():
    """Within the block, every kernel of this process launches without PDL (``pdl_options`` asks ``use_pdl``)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pdl, "use_pdl", lambda t: False)
        yield


def _run(layer, x, res, k0, v0):
    """The layer from a fresh copy of the initial KV cache; returns (out, residual, k_cache, v_cache)."""
    layer.k_cache.copy_(k0)
    layer.v_cache.copy_(v0)
    out, new_res = layer.forward(x, res)
    return out.clone(), new_res.clone(), layer.k_cache.clone(), layer.v_cache.clone()


@pytest.mark.parametrize("rows", [1, 5, 16])
def test_decode_layer_pdl_equals_plain(rows):
    layer = decode_layer.DecodeLayer(rows, context=1500, seed=rows)
    k0, v0 = layer.k_cache.clone(), layer.v_cache.clone()
    inputs = [(torch.randn_like(layer.x), torch.randn_like(layer.residual)) for _ in range(3)]
    with _plain_launches():
        assert pdl.pdl_options(layer.x) == {"USE_PDL": False}
        expected = [_run(layer, x, r, k0, v0) for x, r in inputs]

    assert rows <= PDL_MAX_ROWS and use_pdl(layer.x)
    assert pdl.pdl_options(layer.x) == {"USE_PDL": True, "launch_pdl": True}
    for (x, r), want in zip(inputs, expected):  # eager, with PDL
        for got, ref in zip(_run(layer, x, r, k0, v0), want):
            assert torch.equal(got, ref)

    x_in, r_in = inputs[0][0].clone(), inputs[0][1].clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        layer.forward(x_in, r_in)  # compiles the PDL variants outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, new_res = layer.forward(x_in, r_in)
    for (x, r), want in zip(reversed(inputs), reversed(expected)):  # replays with new inputs
        x_in.copy_(x)
        r_in.copy_(r)
        layer.k_cache.copy_(k0)
        layer.v_cache.copy_(v0)
        graph.replay()
        for got, ref in zip((out, new_res, layer.k_cache, layer.v_cache), want):
            assert torch.equal(got, ref)


def test_pdl_only_up_to_16_rows():
    """The launch mode follows the leading dim: 16 rows with PDL, 17 without."""
    assert use_pdl(torch.zeros(PDL_MAX_ROWS, 8, device="cuda"))
    assert not use_pdl(torch.zeros(PDL_MAX_ROWS + 1, 8, device="cuda"))


def test_engine_pdl_equals_plain_bf16(tiny_model):
    """Greedy tokens with PDL (decode steps of up to 16 rows) equal those without it in any kernel (bf16, CUDA
    graphs and eager prefill; 24 prompts, so the first decode steps have 24 rows and no PDL either way)."""
    prompts = [f"def function_{i}(x):\n    return " + "x + " * i for i in range(24)]
    greedy = [SamplingParams(temperature=0, max_tokens=8 + i, ignore_eos=True) for i in range(24)]
    kw = dict(device="cuda", dtype="bfloat16", gpu_memory_utilization=0.3)
    with _plain_launches(), LLM(tiny_model, **kw) as plain:
        expected = [o["token_ids"] for o in plain.generate(prompts, greedy, use_tqdm=False)]
    with LLM(tiny_model, **kw) as with_pdl:
        assert with_pdl.engine.executor.runner.graph_runner is not None
        got = [o["token_ids"] for o in with_pdl.generate(prompts, greedy, use_tqdm=False)]
    assert got == expected
