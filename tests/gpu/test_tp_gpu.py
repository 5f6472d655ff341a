"""Tensor parallelism on GPUs (NCCL, CUDA graphs on every rank): TP=2 and TP=4 equal TP=1 in float32."""

import os
import signal
import threading
import time

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.kernels.pdl import PDL_MAX_ROWS

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")]

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
PROMPTS = [f"def function_{i}(x):\n    return " + "x + " * i for i in range(12)]


@pytest.mark.parametrize("graphs", [False, True])
def test_tp2_equals_tp1_float32(tiny_model, graphs):
    kw = dict(device="cuda", dtype="float32", gpu_memory_utilization=0.3, enforce_eager=not graphs)
    with LLM(tiny_model, **kw) as one:
        expected = [o["token_ids"] for o in one.generate(PROMPTS, GREEDY, use_tqdm=False)]
    with LLM(tiny_model, tensor_parallel_size=2, **kw) as two:
        assert (two.engine.executor.runner.graph_runner is not None) == graphs
        assert two.engine.executor.runner.tp_group.custom_ar is not None  # on by default
        got = [o["token_ids"] for o in two.generate(PROMPTS, GREEDY, use_tqdm=False)]
    assert got == expected


def _check_tp_equals_tp1(model: str, tp: int, check, params=GREEDY, prompts=PROMPTS, **engine_args) -> None:
    """TP=``tp`` (CUDA graphs, ``engine_args`` given) gives TP=1's tokens for ``params`` (default greedy) in
    float32; ``check(runner)`` first."""
    kw = dict(device="cuda", dtype="float32", gpu_memory_utilization=0.3)
    with LLM(model, **kw) as one:
        expected = [o["token_ids"] for o in one.generate(prompts, params, use_tqdm=False)]
    with LLM(model, tensor_parallel_size=tp, **kw, **engine_args) as many:
        check(many.engine.executor.runner)
        got = [o["token_ids"] for o in many.generate(prompts, params, use_tqdm=False)]
    diffs = [(i, next((j for j, (a, b) in enumerate(zip(g, e)) if a != b), min(len(g), len(e))), g, e)
             for i, (g, e) in enumerate(zip(got, expected)) if g != e]
    # NOTE: which prompts and from which token on (an intermittent mismatch was seen once with PDL + fused norm)
    assert not diffs, (f"TP={tp} != TP=1 for {len(diffs)} prompts (prompt, first differing token, TP={tp}, TP=1): "
                       f"{diffs}; {_diagnose(model, tp, dict(kw, **engine_args), params, prompts, expected, got, diffs)}")


def _diagnose(model: str, tp: int, kw: dict, params, prompts: list, expected: list, got: list, diffs: list) -> str:
    """After a mismatch: does each side repeat its own tokens (a race or nondeterminism if not), and how far
    apart were TP=1's two best tokens where the outputs part (a near-tie if ~1e-6)?"""
    rows = params if isinstance(params, list) else [params] * len(prompts)
    if any(p.temperature != 0 for p in rows):
        return "no diagnosis (sampled, not greedy)"
    with_lp = [SamplingParams(temperature=0, max_tokens=p.max_tokens, ignore_eos=p.ignore_eos, logprobs=2)
               for p in rows]
    with LLM(model, **kw) as one:
        again = one.generate(prompts, with_lp, use_tqdm=False)
    with LLM(model, tensor_parallel_size=tp, **kw) as many:
        got_again = [o["token_ids"] for o in many.generate(prompts, params, use_tqdm=False)]
    margins = {}
    for i, j, _, _ in diffs:
        lps = again[i].get("logprobs") or []
        if j < len(lps):
            top = sorted(lps[j].values(), reverse=True)
            margins[i] = top[0] - top[1] if len(top) > 1 else None
    one_same = [o["token_ids"] for o in again] == expected
    return (f"diagnosis: TP=1 rerun {'repeats' if one_same else 'DIFFERS from'} its first run, TP={tp} rerun "
            f"{'repeats' if got_again == got else 'DIFFERS from'} its first run; TP=1 top-2 logprob margin at the "
            f"first differing token, by prompt: {margins}")


@pytest.mark.skipif(torch.cuda.device_count() < 4, reason="needs 4 CUDA GPUs")
def test_tp4_equals_tp1_float32(tiny_model):
    """4 ranks, CUDA graphs and the custom all-reduce on each; the tiny models have fewer KV heads than 4
    (replicated) and 4 query heads (one a rank)."""
    def check(runner):
        assert runner.tp_group.custom_ar is not None
    _check_tp_equals_tp1(tiny_model, 4, check)


def test_tp2_fused_all_reduce_norm_equals_tp1(tiny_model):
    """Row-parallel sums inside the next RMSNorm (always at TP > 1; one kernel with the custom all-reduce for
    up to 16 rows), CUDA graphs."""
    def check(runner):
        layer = runner.model.model.layers[0]
        assert not layer.mlp.down_proj.reduce_results and not layer.self_attn.o_proj.reduce_results
        assert layer.post_attention_layernorm.tp_group is runner.tp_group
        assert runner.tp_group.custom_ar is not None
    _check_tp_equals_tp1(tiny_model, 2, check)


def test_tp2_pdl_and_plain_decode_steps_equal_tp1(tiny_model):
    """Decode steps of more than 16 rows launch without PDL (and sum outside the fused norm kernel), those of up
    to 16 rows with it (a no-op before sm_90), on every rank: 24 prompts of 8..31 tokens, so the decode
    batch shrinks from 24 rows to 1 through both, CUDA graphs."""
    prompts = [f"def function_{i}(x):\n    return " + "x + " * i for i in range(24)]
    params = [SamplingParams(temperature=0, max_tokens=8 + i, ignore_eos=True) for i in range(24)]
    assert len(prompts) > PDL_MAX_ROWS

    def check(runner):
        assert runner.graph_runner is not None and runner.tp_group.custom_ar is not None
    _check_tp_equals_tp1(tiny_model, 2, check, params=params, prompts=prompts)


def test_tp2_nccl_only_equals_tp1(tiny_model):
    """The custom all-reduce off (engine argument ``disable_custom_all_reduce=True``): NCCL does every sum,
    with CUDA graphs."""
    def check(runner):
        assert runner.config.parallel_config.disable_custom_all_reduce
        assert runner.tp_group.custom_ar is None and runner.graph_runner is not None
    _check_tp_equals_tp1(tiny_model, 2, check, disable_custom_all_reduce=True)


def test_tp2_sharded_sampling_equals_tp1(tiny_model):
    """Each rank samples its vocabulary slice with the fused Gumbel pass (always at TP > 1 on GPUs; greedy and
    seeded temperature rows; CUDA graphs, asynchronous scheduling), rank 0 picks the best pair."""
    params = [GREEDY if i % 3 == 0 else SamplingParams(temperature=(0.6, 1.0, 1.3)[i % 3], seed=100 + i,
                                                        max_tokens=24, ignore_eos=True) for i in range(len(PROMPTS))]
    runners = []

    def check(runner):
        assert runner.sharded_sampling and runner.sampler.fused and runner.share_sampled
        runners.append(runner)
    _check_tp_equals_tp1(tiny_model, 2, check, params=params)
    assert runners[0].num_sharded_steps > 0


def test_killed_worker_on_gpu_raises_clear_error(tiny_tied_model):
    """NCCL: a worker killed mid-generation -> RuntimeError within 30 s (the group is aborted), no hang."""
    llm = LLM(tiny_tied_model, tensor_parallel_size=2, device="cuda", dtype="float32", gpu_memory_utilization=0.3,
              max_model_len=1024)
    assert llm.engine.config.scheduler_config.async_scheduling and llm.engine.executor.runner.share_sampled
    pid = llm.engine.executor.procs[0].pid
    try:
        for p in PROMPTS[:4]:
            llm.engine.add_request(p, SamplingParams(temperature=0, ignore_eos=True, max_tokens=900))
        for _ in range(3):
            llm.engine.step()
        threading.Timer(0.05, os.kill, (pid, signal.SIGKILL)).start()
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match=r"worker rank 1 died"):
            while time.monotonic() - t0 < 30:
                llm.engine.step()
        assert time.monotonic() - t0 < 30
    finally:
        llm.close()
    assert llm.engine.executor.procs[0].exitcode is not None
