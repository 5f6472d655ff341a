"""Property-based tests: random workloads through the Scheduler with a fake runner.

After every step: the token budget holds, blocks neither leak nor double-free, ref counts
equal block-table references (``check_integrity``), and a step with unfinished work always
computes something. At the end every request has exactly ``max_tokens`` tokens and all
blocks are back. Starvation bound: each request finishes within ``STARVATION_FACTOR`` times
the total number of tokens of the workload, counted in steps after its arrival.
"""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minivllm.core.block_manager import BlockManager
from minivllm.core.scheduler import Scheduler
from minivllm.core.sequence import Sequence
from minivllm.sampling_params import SamplingParams
from tests.helpers.scheduler_utils import fake_tokens, new_seq

STARVATION_FACTOR = 2


@st.composite
def workloads(draw):
    block_size = draw(st.sampled_from([16, 32]))
    num_blocks = draw(st.integers(4, 40))
    max_model_len = draw(st.integers(block_size, num_blocks * block_size))
    prefixes = [draw(st.lists(st.integers(0, 3), min_size=0, max_size=3 * block_size)) for _ in range(2)]
    reqs = []
    for _ in range(draw(st.integers(1, 12))):
        arrival = draw(st.integers(0, 30))
        max_tokens = draw(st.integers(1, max(1, min(40, max_model_len // 2))))
        prefix = prefixes[draw(st.integers(0, 1))][: max(0, max_model_len - max_tokens - 1)]
        room = max_model_len - max_tokens - len(prefix)
        suffix = draw(st.lists(st.integers(4, 99), min_size=1 if not prefix else 0, max_size=max(1, min(room, 80))))
        prompt = (prefix + suffix)[: max_model_len - max_tokens] or [5]
        reqs.append((arrival, prompt, max_tokens))
    cfg = dict(
        max_num_seqs=draw(st.integers(1, 8)),
        max_num_batched_tokens=draw(st.integers(1, 96)),
        long_prefill_threshold=draw(st.sampled_from([0, 0, 8, 24])),
        max_num_partial_prefills=draw(st.integers(1, 3)),
        enable_prefix_caching=draw(st.booleans()),
    )
    cfg["max_long_partial_prefills"] = draw(st.integers(1, cfg["max_num_partial_prefills"]))
    return block_size, num_blocks, max_model_len, reqs, cfg


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_random_workloads_keep_invariants_and_finish(workload):
    block_size, num_blocks, max_model_len, reqs, cfg = workload
    bm = BlockManager(num_blocks, block_size, cfg.pop("enable_prefix_caching"))
    sched = Scheduler(bm, max_model_len=max_model_len, eos_token_ids=[0], **cfg)
    total_tokens = sum(len(p) + m for _, p, m in reqs)
    pending = sorted(enumerate(reqs), key=lambda x: x[1][0])
    seqs: dict[int, Sequence] = {}
    arrived_at: dict[int, int] = {}
    finished_at: dict[int, int] = {}
    step = 0
    while pending or not sched.is_finished():
        while pending and pending[0][1][0] <= step:
            i, (_, prompt, max_tokens) = pending.pop(0)
            seqs[i] = new_seq(prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
            arrived_at[i] = step
            sched.add(seqs[i])
        out = sched.schedule()
        assert out.num_batched_tokens <= cfg["max_num_batched_tokens"]
        assert sum(len(r.token_ids) for r in out.rows) == out.num_batched_tokens
        if not sched.is_finished():
            assert out.num_batched_tokens > 0, "a step with unfinished work computed nothing"
        sched.update_from_output(out, fake_tokens(out))
        sched.check_integrity()
        for i, seq in seqs.items():
            if seq.is_finished and i not in finished_at:
                finished_at[i] = step
        step += 1
        assert step < 100_000
    for i, seq in seqs.items():
        assert seq.num_completion_tokens == reqs[i][2]
        assert seq.finish_reason == "length"
        assert finished_at[i] - arrived_at[i] <= STARVATION_FACTOR * total_tokens
    counts = bm.check_integrity()
    assert counts["used"] == 0 and bm.num_free_blocks == num_blocks
