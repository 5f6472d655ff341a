"""The scale-out simulation (benchmarks/scale_out/scale_out_sim.py and scale_out_model.py beside it): exact step
times and compositions, the step builder against minivllm's own scheduler, routing, and scaling."""

from __future__ import annotations

import importlib.util
import json
import random
import sys
from collections import deque
from pathlib import Path

import pytest

from tests.helpers.scheduler_utils import fake_tokens, make_scheduler, make_seq, step

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "scale_out"
sys.path.insert(0, str(BENCH))

from scale_out_model import CostModel, Limits, Replica, Request, plan_step, simulate  # noqa: E402

TOY = CostModel(fixed_ms=2.0, per_decode_row_ms=0.5, per_context_token_ms=0.01, per_prefill_token_ms=0.1)


def _script():
    spec = importlib.util.spec_from_file_location("scale_out_sim", BENCH / "scale_out_sim.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def sim():
    return _script()


@pytest.fixture(scope="module")
def fitted(sim):
    return sim.fit_cost_model()


def test_one_request_alone_takes_one_prefill_step_then_a_decode_step_a_token():
    req = Request(0.0, 100, 5)
    res = simulate([req], 1, TOY)
    assert req.first_token == TOY.step_ms(0, 0, 100) / 1000  # 2 + 0.1 * 100 ms
    t = req.first_token
    for i in range(1, 5):  # 4 decode steps, the row attending to 100 + i keys
        t += TOY.step_ms(1, 100 + i, 0) / 1000
    assert req.finish == pytest.approx(t, rel=1e-12)
    assert res.step_tokens == [1, 1, 1, 1, 1] and res.replicas[0].planned == 5
    assert res.replicas[0].context == 0 and res.replicas[0].in_flight == 0


def test_one_request_ttft_under_the_fitted_model(fitted):
    req = Request(0.0, 777, 1)
    simulate([req], 1, fitted)
    assert req.first_token == req.finish == (fitted.fixed_ms + 777 * fitted.per_prefill_token_ms) / 1000


def test_step_builder_budget_and_max_num_seqs():
    a, b, c, d = (Request(0.0, n, 9) for n in (80, 50, 40, 10))
    # 2 decode rows leave 98 of 100 tokens: a's last 30, b's 50, then 4 sequences run: c and d wait
    chunks, admitted = plan_step(Limits(4, 100), 2, [[a, 30]], deque([b, c, d]))
    assert chunks == [(a, 30), (b, 50)] and admitted == 1
    # 3 decode rows leave 61 of 64: b whole (40 tokens), then c chunked to the 21 left; the budget is spent
    b, c = Request(0.0, 40, 9), Request(0.0, 40, 9)
    chunks, admitted = plan_step(Limits(8, 64), 3, [], deque([b, c, d]))
    assert chunks == [(b, 40), (c, 21)] and admitted == 2
    # a running partial prefill takes the whole budget: nothing is admitted
    chunks, admitted = plan_step(Limits(8, 64), 0, [[a, 70]], deque([b]))
    assert chunks == [(a, 64)] and admitted == 0
    with pytest.raises(ValueError):
        Limits(max_num_seqs=64, max_num_batched_tokens=32)


def _scheduler_steps(sched, async_scheduling: bool) -> list[list[int]]:
    """Row sizes of each step ``minivllm.core.Scheduler`` plans, driven as ``LLMEngine.step`` drives it: with
    asynchronous scheduling a step is planned before the previous one's tokens are handed back."""
    steps, inflight = [], None
    while not (sched.is_finished() and inflight is None):
        if not async_scheduling:
            out = step(sched)
            steps.append(sorted(len(r.token_ids) for r in out.rows))
            continue
        out = sched.schedule()
        if out.rows:
            steps.append(sorted(len(r.token_ids) for r in out.rows))
        if inflight is not None:
            sched.update_from_output(inflight, fake_tokens(inflight))
            sched.check_integrity()
        inflight = out if out.rows else None
    return steps


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_steps_match_minivllm_scheduler(async_scheduling):
    """Every step's row sizes equal those of minivllm's own scheduler (KV cache ample, all requests queued)."""
    for trial in range(60):
        rng = random.Random(trial)
        seqs_max = rng.randint(1, 6)
        budget = rng.randint(seqs_max, 64)
        lens = [(rng.randint(1, 80), rng.randint(1, 10)) for _ in range(rng.randint(1, 12))]
        sched = make_scheduler(num_blocks=400, max_num_seqs=seqs_max, budget=budget, max_model_len=256)
        for i, (p, o) in enumerate(lens):
            sched.add(make_seq(p, max_tokens=o, start=1000 * i + 10))
        real = _scheduler_steps(sched, async_scheduling)
        rep, t, ours = Replica(TOY, Limits(seqs_max, budget, async_scheduling=async_scheduling)), 0.0, []
        for p, o in lens:
            rep.add(Request(0.0, p, o))
        while rep.has_work():
            t = rep.start_step(t)
            ours.append(sorted([1] * rep.current.rows + [n for _, n in rep.current.chunks]))
            rep.end_step(t)
        assert ours == real, (trial, lens, seqs_max, budget)


def test_async_scheduling_makes_a_late_arrival_wait_one_more_step():
    """A request arriving while step k runs joins step k+2 with asynchronous scheduling, step k+1 without."""
    ttft = {}
    for mode in (False, True):
        reqs = [Request(0.0, 10, 50), Request(0.001, 10, 50)]
        simulate(reqs, 1, TOY, Limits(8, 64, async_scheduling=mode))
        ttft[mode] = reqs[1].first_token
    first_step = TOY.step_ms(0, 0, 10) / 1000  # 3 ms: the second request arrives during it
    mixed = TOY.step_ms(1, 11, 10) / 1000  # one decode row (context 11) and its prompt
    assert ttft[False] == pytest.approx(first_step + mixed, rel=1e-12)
    assert ttft[True] == pytest.approx(first_step + TOY.step_ms(1, 11, 0) / 1000 + TOY.step_ms(1, 12, 10) / 1000,
                                       rel=1e-12)


def test_least_loaded_spreads_evenly_and_refills_the_replica_that_frees():
    reqs = [Request(0.001 * i, 50, 200) for i in range(12)]
    res = simulate(reqs, 4, TOY, router="least-loaded", until_first_tokens=True)
    assert [r.replica for r in reqs] == [0, 1, 2, 3] * 3 and [rep.in_flight for rep in res.replicas] == [3] * 4
    # replica 2's one-token request is done by 0.1 s: the next goes there, and the one after (all tied) to 0
    reqs = [Request(0.0, 10, 500), Request(0.0, 10, 500), Request(0.0, 10, 1), Request(0.1, 10, 500),
            Request(0.2, 10, 5)]
    simulate(reqs, 3, TOY, router="least-loaded")
    assert [r.replica for r in reqs] == [0, 1, 2, 2, 0]
    random_counts = [0] * 4
    for r in simulate([Request(0.001 * i, 50, 200) for i in range(12)], 4, TOY, router="random").requests:
        random_counts[r.replica] += 1
    assert sum(random_counts) == 12 and random_counts != [3, 3, 3, 3]


def test_fitted_model_traces_to_the_measured_figures(sim, fitted):
    m = sim.MEASURED
    assert fitted.per_context_token_ms == m["decode_240_attention_ms"] / 240_000
    assert fitted.step_ms(1, 400, 0) == pytest.approx(m["decode_1_wall_ms"], rel=1e-12)
    assert fitted.step_ms(240, 240_000, 0) == pytest.approx(m["decode_240_wall_ms"], rel=1e-12)
    reqs = sim.nano_requests()
    assert sum(r.prompt_len for r in reqs) == 142_827 and sum(r.output_len for r in reqs) == 133_966
    makespan = max(r.finish for r in simulate(reqs, 1, fitted).requests)
    assert 133_966 / makespan == pytest.approx(m["nano_tok_s"], rel=1e-9)


def test_saturated_throughput_scales_with_replicas(sim, fitted):
    limits = Limits(max_num_seqs=32, max_num_batched_tokens=1024)
    one = sim.saturated(fitted, limits, 1, duration=300.0, warmup=20.0, seed=0)
    four = sim.saturated(fitted, limits, 4, duration=300.0, warmup=20.0, seed=0)
    assert four / (4 * one) == pytest.approx(1.0, abs=0.005)


def test_replicas_under_a_backlog_are_independent_engines():
    """A backlog at t=0 goes round robin under least-loaded routing; each replica then runs exactly as a lone
    engine given its share of the requests."""
    rng = random.Random(1)
    sizes = [(rng.randint(100, 1024), rng.randint(100, 1024)) for _ in range(400)]
    fresh = lambda part: [Request(0.0, p, o) for p, o in part]
    limits = Limits(max_num_seqs=16, max_num_batched_tokens=512)
    together = simulate(fresh(sizes), 4, TOY, limits, stop_at=60.0)
    alone = [simulate(fresh(sizes[k::4]), 1, TOY, limits, stop_at=60.0) for k in range(4)]
    assert [r.replica for r in together.requests] == [0, 1, 2, 3] * 100
    assert together.tokens_between(10.0, 60.0) == sum(a.tokens_between(10.0, 60.0) for a in alone) > 0
    assert sorted(together.step_end) == sorted(t for a in alone for t in a.step_end)


def test_script_end_to_end(sim, tmp_path, capsys):
    out, png = tmp_path / "r.json", tmp_path / "p.png"
    res = sim.main(["--replicas", "1,2", "--loads", "0.5", "--duration", "40", "--warmup", "10", "--min-requests",
                    "0", "--saturation-duration", "60", "--json-out", str(out), "--out", str(png)])
    text = capsys.readouterr().out
    assert "offered req/s" in text and text.count("\n 0.5 ") == 2
    saved = json.loads(out.read_text())
    assert [(r["replicas"], r["router"]) for r in saved["results"]] == [
        (n, r) for n in (1, 2) for r in ("least-loaded", "random", "p2c")]
    for r in res["results"]:
        assert 0 < r["ttft_p50_ms"] <= r["ttft_p99_ms"] and r["output_tok_s"] > 0
    assert png.stat().st_size > 10_000
