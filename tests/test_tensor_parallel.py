"""Tensor parallelism on the CPU over gloo: TP=2 gives TP=1's greedy tokens; worker death and cleanup.

One TP=2 engine per tiny checkpoint is shared by the module (both alive at once); the failure
and lifecycle tests build their own. Every process uses one torch thread (2 shared cores).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from minivllm import LLM, SamplingParams

pytestmark = pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                                reason="needs torch.distributed with gloo")

KW = dict(device="cpu", dtype="float32")
CHUNKED = dict(max_num_batched_tokens=32, num_kvcache_blocks=40, max_model_len=512)
PROMPTS = [[(7 * i + 3 * j + 1) % 380 for j in range(3 + 11 * i)] for i in range(12)]  # 3..124 tokens
GREEDY = SamplingParams(temperature=0, ignore_eos=True, max_tokens=20)
REPO = str(Path(__file__).resolve().parents[1])


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


def _run(llm: LLM, params: SamplingParams = GREEDY) -> tuple[list[list[int]], int]:
    """Greedy tokens of PROMPTS (prompt order) through the step API, and how many preemptions happened."""
    ids = [llm.engine.add_request(p, params) for p in PROMPTS]
    done, preempted = {}, 0
    while len(done) < len(ids):
        outputs, stats = llm.engine.step()
        preempted += stats.num_preempted
        done.update({o.request_id: o.outputs[0].token_ids for o in outputs if o.finished})
    return [done[i] for i in ids], preempted


def _reference(model: str, **kw) -> tuple[list[list[int]], int]:
    with LLM(model, **KW, **kw) as llm:
        assert llm.engine.executor.runner.model.model.norm.tp_group is None  # TP=1: nothing to sum
        return _run(llm)


def _alive(pid: int) -> bool:
    try:
        import psutil
    except ImportError:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except (FileNotFoundError, ProcessLookupError):
            return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _our_shm() -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"mvllm_tp_{os.getpid()}_")]


@pytest.fixture(scope="module")
def tp2_tied(tiny_tied_model):
    llm = LLM(tiny_tied_model, tensor_parallel_size=2, **KW)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def tp2_untied(tiny_untied_model):
    llm = LLM(tiny_untied_model, tensor_parallel_size=2, **KW)
    yield llm
    llm.close()


def _sums_in_the_norms(runner) -> None:
    """At TP > 1, o_proj / down_proj leave their sums to the next RMSNorm (gloo's all-reduce then the norm here;
    on GPUs one kernel where the custom all-reduce takes it): every decoder norm and the final one sum."""
    model = runner.model.model
    for layer in model.layers:
        assert not layer.self_attn.o_proj.reduce_results and not layer.mlp.down_proj.reduce_results
        assert layer.input_layernorm.tp_group is runner.tp_group
        assert layer.post_attention_layernorm.tp_group is runner.tp_group
    assert model.norm.tp_group is runner.tp_group is not None


def test_tp2_matches_tp1_tied(tp2_tied, tiny_tied_model):
    """TP=2's greedy tokens are TP=1's, with the row-parallel sums in the norms (the only path at TP > 1)."""
    runner = tp2_tied.engine.executor.runner
    attn = runner.model.model.layers[0].self_attn
    assert (attn.num_heads, attn.num_kv_heads) == (2, 1)  # 4 heads / 2 kv heads split over 2 ranks
    # the torch backend on the CPU: no Triton sampler, so every step gathers the logits to rank 0
    assert not runner.sharded_sampling and not runner.sampler.fused
    _sums_in_the_norms(runner)
    assert _run(tp2_tied)[0] == _reference(tiny_tied_model)[0]


def test_tp2_matches_tp1_kv_heads_replicated(tp2_untied, tiny_untied_model):
    qkv = tp2_untied.engine.executor.runner.model.model.layers[0].self_attn.qkv_proj
    assert (qkv.num_heads, qkv.num_kv_heads, qkv.num_kv_replicas) == (2, 1, 2)  # 1 kv head on both ranks
    _sums_in_the_norms(tp2_untied.engine.executor.runner)
    assert _run(tp2_untied)[0] == _reference(tiny_untied_model)[0]


@pytest.mark.slow
@pytest.mark.triton
def test_tp2_triton_backend_matches_tp1(tiny_untied_model):
    """Each rank's Triton kernels (the fused q/k norm + RoPE + K/V store into its own cache, paged attention
    over its KV heads) give the torch backend's TP=1 tokens (the interpreter on the CPU)."""
    prompts = PROMPTS[:4]
    params = SamplingParams(temperature=0, ignore_eos=True, max_tokens=6)
    with LLM(tiny_untied_model, **KW) as ref:
        want = [o["token_ids"] for o in ref.generate(prompts, params, use_tqdm=False)]
    with LLM(tiny_untied_model, tensor_parallel_size=2, attention_backend="triton", **KW) as llm:
        got = [o["token_ids"] for o in llm.generate(prompts, params, use_tqdm=False)]
    assert got == want


def test_tp2_prompt_logprobs_and_logit_bias_match_tp1(tp2_tied, tiny_tied_model):
    """Every rank puts the prompt positions through the LM head (a gather), slice by slice: TP=2's prompt
    logprobs are TP=1's; a logit_bias row takes the gather path and is forced."""
    prompt = [5 + (7 * i) % 200 for i in range(50)]
    params = [SamplingParams(temperature=0, max_tokens=3, prompt_logprobs=2),
              SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, logit_bias={42: 100})]
    with LLM(tiny_tied_model, **KW) as ref:
        want = ref.generate([prompt, "x"], params, use_tqdm=False)
    got = tp2_tied.generate([prompt, "x"], params, use_tqdm=False)
    assert got[1]["token_ids"] == want[1]["token_ids"] == [42] * 3
    for g, w in zip(got[0]["prompt_logprobs"][1:], want[0]["prompt_logprobs"][1:]):
        assert g.keys() == w.keys() and all(abs(g[t].logprob - w[t].logprob) < 1e-4 for t in g)


def test_tp2_structured_outputs_match_tp1(tiny_tied_model):
    """Rows under a grammar at TP=2, sampled after their forward while the workers wait on the tokens'
    broadcast (asynchronous scheduling): TP=1's tokens, and free rows beside them untouched."""
    import re

    from minivllm.sampling_params import StructuredOutputsParams

    params = [SamplingParams(temperature=0, max_tokens=12, structured_outputs=StructuredOutputsParams(
        regex=r"[a-z]{2,5}-[0-9]{2}")), GREEDY,
        SamplingParams(temperature=0, max_tokens=12, structured_outputs=StructuredOutputsParams(choice=["ab", "cd"]))]
    prompts = ["x = ", PROMPTS[3], "y"]
    with LLM(tiny_tied_model, async_scheduling=True, **KW) as ref:
        want = ref.generate(prompts, params, use_tqdm=False)
    with LLM(tiny_tied_model, tensor_parallel_size=2, async_scheduling=True, **KW) as llm:
        got = llm.generate(prompts, params, use_tqdm=False)
    assert [o["token_ids"] for o in got] == [o["token_ids"] for o in want]
    assert re.fullmatch(r"[a-z]{2,5}-[0-9]{2}", got[0]["text"]) and got[2]["text"] in ("ab", "cd")


@pytest.mark.slow
def test_tp2_chunked_prefill_small_cache(tiny_tied_model):
    ref, _ = _reference(tiny_tied_model, **CHUNKED)
    with LLM(tiny_tied_model, tensor_parallel_size=2, **KW, **CHUNKED) as llm:
        assert llm.engine.executor.num_kvcache_blocks == 40
        out, preempted = _run(llm)
    assert preempted > 0  # the small cache forces recomputation
    assert out == ref


def test_two_engines_at_once_then_close_leaves_nothing(tp2_tied, tp2_untied):
    a, b = tp2_tied.engine.executor, tp2_untied.engine.executor
    assert a.shm.name != b.shm.name and a.init_method != b.init_method
    pids = [p.pid for p in a.procs + b.procs]
    assert all(_alive(pid) for pid in pids) and len(_our_shm()) == 2
    tp2_tied.close()
    tp2_tied.close()  # idempotent
    assert _run(tp2_untied)[0]  # the other engine is unaffected
    tp2_untied.close()
    assert not any(_alive(pid) for pid in pids)
    assert not [p for p in a.procs + b.procs if p.exitcode != 0]  # they exited on the "exit" command
    assert _our_shm() == []


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_killed_worker_raises_clear_error(tiny_tied_model, async_scheduling):
    llm = LLM(tiny_tied_model, tensor_parallel_size=2, max_model_len=1024, async_scheduling=async_scheduling, **KW)
    pid = llm.engine.executor.procs[0].pid
    started = threading.Event()
    killer = threading.Thread(target=lambda: started.wait(30) and (time.sleep(0.02), os.kill(pid, signal.SIGKILL)))
    killer.start()
    try:
        for p in PROMPTS[:4]:
            llm.engine.add_request(p, SamplingParams(temperature=0, ignore_eos=True, max_tokens=900))
        for _ in range(3):
            llm.engine.step()
        started.set()  # the kill lands mid-step or between steps
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match=r"worker rank 1 died \(exit code -9\)"):
            while time.monotonic() - t0 < 30:
                llm.engine.step()
        assert time.monotonic() - t0 < 30
        with pytest.raises(RuntimeError, match="rank 1 died"):  # stays failed, no hang
            llm.engine.step()
    finally:
        killer.join()
        llm.close()
    assert not _alive(pid) and _our_shm() == []


def test_rank0_error_mid_step_stops_engine(tiny_tied_model):
    """Rank 0 leaves a step half-way (workers wait in a collective): the engine stops, no garbage later."""
    llm = LLM(tiny_tied_model, tensor_parallel_size=2, **KW)
    try:
        pids = [p.pid for p in llm.engine.executor.procs]
        mlp = llm.engine.executor.runner.model.model.layers[1].mlp

        def boom(x):
            raise KeyboardInterrupt

        mlp.forward = boom
        with pytest.raises(KeyboardInterrupt):
            llm.generate(PROMPTS[:2], GREEDY, use_tqdm=False)
        del mlp.forward
        with pytest.raises(RuntimeError, match="failed on rank 0 .*out of step"):
            llm.generate(PROMPTS[:2], GREEDY, use_tqdm=False)
        assert not any(_alive(pid) for pid in pids)
    finally:
        llm.close()
    assert _our_shm() == []


_CHILD = """
import json, os, signal, sys
from minivllm import LLM, SamplingParams
llm = LLM(sys.argv[1], tensor_parallel_size=2, device="cpu", dtype="float32")
llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4), use_tqdm=False)
print(json.dumps({"pids": [p.pid for p in llm.engine.executor.procs], "shm": llm.engine.executor.shm.name}), flush=True)
if sys.argv[2] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["exit", "kill"])
def test_workers_end_with_the_engine_process(tiny_tied_model, how):
    """Exit without close(): the engine's finalizer stops the workers. SIGKILL: they see their parent go."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", _CHILD, tiny_tied_model, how], capture_output=True, text=True,
                          timeout=120, env=env)
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == (0 if how == "exit" else -signal.SIGKILL), proc.stderr
    assert "Traceback" not in proc.stderr and "terminate called" not in proc.stderr, proc.stderr
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(_alive(p) for p in info["pids"]):
        time.sleep(0.2)
    assert not any(_alive(p) for p in info["pids"])
    assert not os.path.exists(f"/dev/shm/{info['shm']}")  # kill: the resource tracker unlinks it
    assert how == "kill" or "leaked" not in proc.stderr, proc.stderr


def test_tp_group_collectives_over_gloo():
    """Two ranks' ``TPGroup`` on the CPU (gloo): sum and min all-reduces in place, broadcast, gather."""
    import socket

    from minivllm.distributed.group import TPGroup, rank_and_size

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results, groups = {}, {}

    def rank_main(rank: int) -> None:
        g = TPGroup(torch.device("cpu"), f"tcp://127.0.0.1:{port}", 2, rank, timeout_s=60)
        groups[rank] = g
        assert g.comm is None and g.custom_ar is None  # gloo only
        x = torch.full((4,), float(rank + 1))
        g.all_reduce(x)
        m = torch.tensor([rank + 5], dtype=torch.int64)
        g.all_reduce(m, "min")
        b = torch.arange(3) * (rank + 1)
        g.broadcast(b, src=0)
        parts = g.gather(torch.full((2,), float(rank)), dst=0)
        results[rank] = (x.tolist(), int(m), b.tolist(), None if parts is None else [p.tolist() for p in parts],
                         rank_and_size(g))

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for g in groups.values():
        g.shutdown()
    assert set(results) == {0, 1}
    for rank, (x, m, b, parts, rs) in results.items():
        assert x == [3.0] * 4 and m == 5 and b == [0, 1, 2] and rs == (rank, 2)
        assert parts == ([[0.0, 0.0], [1.0, 1.0]] if rank == 0 else None)
    assert rank_and_size(None) == (0, 1)


@pytest.mark.slow
def test_tp2_on_cpu_without_the_triton_interpreter(tiny_tied_model):
    """A user's CPU run (no ``TRITON_INTERPRET``, which the tests otherwise set): TP=2 starts, samples through
    the gathered logits (the sharded path's kernels are Triton's) and gives TP=1's greedy tokens. Before the
    fix, a worker died in its first greedy step."""
    code = f"""
import json, torch
from minivllm import LLM, SamplingParams
torch.set_num_threads(1)
greedy = SamplingParams(temperature=0, ignore_eos=True, max_tokens=8)
prompts = {PROMPTS[:3]!r}
out = {{}}
for tp in (1, 2):
    with LLM({tiny_tied_model!r}, device="cpu", dtype="float32", tensor_parallel_size=tp) as llm:
        assert llm.engine.executor.runner.sharded_sampling is False
        out[tp] = [o["token_ids"] for o in llm.generate(prompts, greedy, use_tqdm=False)]
print(json.dumps(out))
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["2"] == out["1"] and len(out["1"]) == 3 and all(len(t) == 8 for t in out["1"])
