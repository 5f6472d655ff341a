"""Tensor parallelism on GPUs (NCCL, CUDA graphs on every rank): TP=2 and TP=4 equal TP=1 in float32."""

import os
import signal
import threading
import time

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.utils.tp_switches import custom_all_reduce_enabled, tp_cuda_graphs_enabled

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")]

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
PROMPTS = [f"def function_{i}(x):\n    return " + "x + " * i for i in range(12)]


@pytest.mark.parametrize("graphs", [False, pytest.param(True, marks=pytest.mark.skipif(
    not tp_cuda_graphs_enabled(),
    reason="TP + CUDA graphs turned off (MINIVLLM_TP_COMM=c10d or MINIVLLM_TP_CUDA_GRAPHS=0)"))])
def test_tp2_equals_tp1_float32(tiny_model, graphs):
    kw = dict(device="cuda", dtype="float32", gpu_memory_utilization=0.3, enforce_eager=not graphs)
    with LLM(tiny_model, **kw) as one:
        expected = [o["token_ids"] for o in one.generate(PROMPTS, GREEDY, use_tqdm=False)]
    with LLM(tiny_model, tensor_parallel_size=2, **kw) as two:
        assert (two.executor.runner.graph_runner is not None) == graphs
        assert (two.executor.runner.tp_group.custom_ar is not None) == custom_all_reduce_enabled()
        got = [o["token_ids"] for o in two.generate(PROMPTS, GREEDY, use_tqdm=False)]
    assert got == expected


def _check_tp_equals_tp1(model: str, tp: int, check, monkeypatch, env: dict[str, str] | None = None,
                         params=GREEDY) -> None:
    """TP=``tp`` (CUDA graphs, ``env`` set) gives TP=1's tokens for ``params`` (default greedy) in float32;
    ``check(runner)`` first."""
    kw = dict(device="cuda", dtype="float32", gpu_memory_utilization=0.3)
    with LLM(model, **kw) as one:
        expected = [o["token_ids"] for o in one.generate(PROMPTS, params, use_tqdm=False)]
    for k, v in (env or {}).items():
        monkeypatch.setenv(k, v)
    with LLM(model, tensor_parallel_size=tp, **kw) as many:
        check(many.executor.runner)
        got = [o["token_ids"] for o in many.generate(PROMPTS, params, use_tqdm=False)]
    diffs = [(i, next((j for j, (a, b) in enumerate(zip(g, e)) if a != b), min(len(g), len(e))), g, e)
             for i, (g, e) in enumerate(zip(got, expected)) if g != e]
    # NOTE: which prompts and from which token on (an intermittent mismatch was seen once with PDL + fused norm)
    assert not diffs, (f"TP={tp} != TP=1 for {len(diffs)} prompts (prompt, first differing token, TP={tp}, TP=1): "
                       f"{diffs}; {_diagnose(model, tp, kw, params, expected, got, diffs)}")


def _diagnose(model: str, tp: int, kw: dict, params: SamplingParams, expected: list, got: list, diffs: list) -> str:
    """After a mismatch: does each side repeat its own tokens (a race or nondeterminism if not), and how far
    apart were TP=1's two best tokens where the outputs part (a near-tie if ~1e-6)?"""
    if params.temperature != 0:
        return "no diagnosis (sampled, not greedy)"
    with_lp = SamplingParams(temperature=0, max_tokens=params.max_tokens, ignore_eos=params.ignore_eos, logprobs=2)
    with LLM(model, **kw) as one:
        again = one.generate(PROMPTS, with_lp, use_tqdm=False)
    with LLM(model, tensor_parallel_size=tp, **kw) as many:
        got_again = [o["token_ids"] for o in many.generate(PROMPTS, params, use_tqdm=False)]
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
def test_tp4_equals_tp1_float32(tiny_model, monkeypatch):
    """4 ranks, CUDA graphs and the custom all-reduce on each; the tiny models have fewer KV heads than 4
    (replicated) and 4 query heads (one a rank)."""
    def check(runner):
        assert (runner.tp_group.custom_ar is not None) == custom_all_reduce_enabled()
    _check_tp_equals_tp1(tiny_model, 4, check, monkeypatch)


def test_tp2_fused_all_reduce_norm_equals_tp1(tiny_model, monkeypatch):
    """``MINIVLLM_FUSED_AR_NORM=1``: row-parallel sums inside the next RMSNorm (one kernel), CUDA graphs."""
    def check(runner):
        assert not runner.model.model.layers[0].mlp.down_proj.reduce_results
        assert (runner.tp_group.custom_ar is not None) == custom_all_reduce_enabled()
    _check_tp_equals_tp1(tiny_model, 2, check, monkeypatch, {"MINIVLLM_FUSED_AR_NORM": "1", "MINIVLLM_PDL": "0"})


@pytest.mark.parametrize("pdl,fused_norm", [("0", "0"), ("1", "1")])
def test_tp2_pdl_and_fused_norm_equal_tp1(tiny_model, pdl, fused_norm, monkeypatch):
    """``MINIVLLM_PDL`` (on every rank, the custom all-reduce kernels included; a no-op before sm_90) and
    ``MINIVLLM_FUSED_AR_NORM`` both off (the path before 2026-11-23) and both on (the defaults), CUDA graphs;
    ``test_tp2_fused_all_reduce_norm_equals_tp1`` runs the fused norm alone."""
    def check(runner):
        assert (runner.tp_group.custom_ar is not None) == custom_all_reduce_enabled()
        assert runner.model.model.layers[0].mlp.down_proj.reduce_results == (fused_norm == "0")
    _check_tp_equals_tp1(tiny_model, 2, check, monkeypatch, {"MINIVLLM_PDL": pdl, "MINIVLLM_FUSED_AR_NORM": fused_norm})


def test_tp2_nccl_only_equals_tp1(tiny_model, monkeypatch):
    """The custom all-reduce off (``MINIVLLM_CUSTOM_AR=0``): NCCL does every sum, with CUDA graphs."""
    def check(runner):
        assert runner.tp_group.custom_ar is None
    _check_tp_equals_tp1(tiny_model, 2, check, monkeypatch, {"MINIVLLM_CUSTOM_AR": "0"})


@pytest.mark.parametrize("fused_norm", ["0", "1"])
def test_tp2_overlapped_row_sums_equal_tp1(tiny_model, fused_norm, monkeypatch):
    """``MINIVLLM_TP_OVERLAP_MIN_ROWS=16``: prefills of 16+ tokens sum o_proj / down_proj in 3 slices, NCCL on a
    side stream overlapping the next slice's matmul; decode steps keep the CUDA graphs' kernels."""
    runners = []

    def check(runner):
        assert runner.tp_group.overlaps_row_sum(16) and not runner.tp_group.overlaps_row_sum(15)
        runners.append(runner)
    _check_tp_equals_tp1(tiny_model, 2, check, monkeypatch, {"MINIVLLM_TP_OVERLAP_MIN_ROWS": "16",
                                                             "MINIVLLM_TP_OVERLAP_CHUNKS": "3",
                                                             "MINIVLLM_FUSED_AR_NORM": fused_norm})
    assert runners[0].tp_group.num_overlapped_sums > 0 and runners[0].tp_group.side_stream() is not None


@pytest.mark.parametrize("fused_norm", ["0", "1"])
def test_tp2_decode_overlapped_row_sums_equal_tp1(tiny_model, fused_norm, monkeypatch):
    """``MINIVLLM_TP_DECODE_OVERLAP_SLICES=3`` with decode batches of 4-12 rows: o_proj / down_proj sum their output
    in 3 slices, the custom all-reduce on a side stream under the next slice's matmul, inside the captured
    decode graphs; the norms after them do not sum again."""
    runners = []

    def check(runner):
        assert runner.tp_group.row_sum_plan(4) == (3, True) and runner.graph_runner is not None
        runners.append(runner)
    _check_tp_equals_tp1(tiny_model, 2, check, monkeypatch, {"MINIVLLM_TP_DECODE_OVERLAP_SLICES": "3",
                                                             "MINIVLLM_TP_DECODE_OVERLAP_MIN_ROWS": "4",
                                                             "MINIVLLM_TP_DECODE_OVERLAP_MAX_ROWS": "12",
                                                             "MINIVLLM_FUSED_AR_NORM": fused_norm})
    assert runners[0].tp_group.num_overlapped_sums > 0 and runners[0].tp_group.side_stream() is not None


def test_tp2_sharded_sampling_equals_tp1(tiny_model, monkeypatch):
    """``MINIVLLM_TP_SHARDED_SAMPLING=1``: each rank samples its vocabulary slice with the fused Gumbel pass
    (greedy and seeded temperature rows; CUDA graphs, asynchronous scheduling), rank 0 picks the best pair."""
    params = [GREEDY if i % 3 == 0 else SamplingParams(temperature=(0.6, 1.0, 1.3)[i % 3], seed=100 + i,
                                                        max_tokens=24, ignore_eos=True) for i in range(len(PROMPTS))]
    runners = []

    def check(runner):
        assert runner.sharded_sampling and runner.sampler.uses_fused(runner.device) and runner.share_sampled
        runners.append(runner)
    _check_tp_equals_tp1(tiny_model, 2, check, monkeypatch, {"MINIVLLM_TP_SHARDED_SAMPLING": "1"}, params=params)
    assert runners[0].num_sharded_steps > 0


def test_killed_worker_on_gpu_raises_clear_error(tiny_tied_model):
    """NCCL: a worker killed mid-generation -> RuntimeError within 30 s (the group is aborted), no hang."""
    llm = LLM(tiny_tied_model, tensor_parallel_size=2, device="cuda", dtype="float32", gpu_memory_utilization=0.3,
              max_model_len=1024)
    assert llm.config.async_scheduling and llm.executor.runner.share_sampled
    pid = llm.executor.procs[0].pid
    try:
        for p in PROMPTS[:4]:
            llm.add_request(p, SamplingParams(temperature=0, ignore_eos=True, max_tokens=900))
        for _ in range(3):
            llm.step()
        threading.Timer(0.05, os.kill, (pid, signal.SIGKILL)).start()
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match=r"worker rank 1 died"):
            while time.monotonic() - t0 < 30:
                llm.step()
        assert time.monotonic() - t0 < 30
    finally:
        llm.close()
    assert llm.executor.procs[0].exitcode is not None
