"""KV cache groups (issue 40, "Memory"): a sliding window's block pool keeps only the blocks its window reaches.

Step by step with exact expectations: the group layout and the budget split, a sliding table releasing its
blocks (``NULL_BLOCK`` in their place) as its oldest query moves on, a prefix hit needing only the window's
blocks and shortened when a group lacks them. Hypothesis: random workloads through the scheduler over a full and
a sliding group, with the runner's persistent batch fed the scheduler's outputs: no block leaked or freed twice,
every sliding table still covers its window, the runner's tables agree with the managers' wherever a query
reads. The engine: a tiny Gemma 3 releases its sliding layers' blocks and admits more concurrent long requests
than a full-attention layout of the same memory, with transformers' tokens.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minivllm.core.block_manager import NULL_BLOCK, BlockManager
from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.core.kv_cache_spec import KVCacheGroupSpec, blocks_per_seq, kv_cache_groups, split_blocks
from minivllm.core.scheduler import Scheduler
from minivllm.core.sequence import Sequence
from minivllm.sampling_params import SamplingParams
from minivllm.worker.input_batch import InputBatch
from tests.helpers.scheduler_utils import fake_tokens, new_seq
from tests.test_scheduler_property import workloads as single_group_workloads


# ------------------------------------------------------------------ layout and budget
def test_groups_by_attention_type():
    # Gemma 3's pattern: five sliding layers, then a global one
    windows = [512] * 5 + [None] + [512] * 5 + [None]
    assert kv_cache_groups(windows) == [KVCacheGroupSpec(None, (5, 11)),
                                        KVCacheGroupSpec(512, (0, 1, 2, 3, 4, 6, 7, 8, 9, 10))]
    assert kv_cache_groups([None, 8, 4, 8]) == [KVCacheGroupSpec(None, (0,)), KVCacheGroupSpec(4, (2,)),
                                                KVCacheGroupSpec(8, (1, 3))]
    assert kv_cache_groups([4096] * 3) == [KVCacheGroupSpec(4096, (0, 1, 2))]  # Mistral: one sliding group
    assert kv_cache_groups(windows, hybrid=False) == [KVCacheGroupSpec(None, tuple(range(12)))]
    with pytest.raises(ValueError, match="at least one attention layer"):
        kv_cache_groups([])


def test_blocks_per_seq_and_split():
    assert blocks_per_seq(None, 100, 16) == 7
    # window 12 over 16-token blocks: a decode step reaches back at most 11 tokens, over 2 blocks
    assert blocks_per_seq(12, 100, 16) == 2
    assert blocks_per_seq(12, 100, 16, chunk=64) == 6  # 11 + 64 tokens from the chunk's first query's window
    assert blocks_per_seq(1024, 100, 16, chunk=64) == 7  # never more than the whole sequence
    assert split_blocks(1000, [10], [7]) == [100]  # one group: the whole budget, as before
    # 1 full layer (10 bytes a block, 8 per sequence), 5 sliding ones (50 bytes, 2 per sequence): 180 bytes a
    # sequence; after the minimums (8 and 3 blocks: 230 bytes) the rest, 770, holds 4 more sequences
    assert split_blocks(1000, [10, 50], [8, 2], [8, 3]) == [8 + 34, 3 + 8]
    assert split_blocks(100, [10, 50], [8, 2], [8, 3]) == [4, 1]  # below the minimums: split as it is


# ------------------------------------------------------------------ a sliding table, step by step
def _run(kv, seq: Sequence, n: int) -> None:
    assert kv.allocate_slots(seq, n)
    seq.num_computed_tokens += n
    kv.check_integrity()
    kv.check_window(seq)


def test_sliding_table_releases_blocks_behind_the_window():
    bm = BlockManager(8, 4, sliding_window=6)  # a query at p reads keys (p - 6, p]
    seq = Sequence(0, list(range(100, 120)))  # 20 tokens
    _run(bm, seq, 8)
    assert bm.block_table(0) == (0, 1)
    _run(bm, seq, 4)  # the oldest query, 8, reads from 3 on: block 0 still needed
    assert bm.block_table(0) == (0, 1, 2)
    _run(bm, seq, 4)  # the oldest query, 12, reads from 7 on: block 0 (tokens 0-3) released, cached
    assert bm.block_table(0) == (NULL_BLOCK, 1, 2, 3)
    assert bm.num_used_blocks == 3 and bm.num_cached_blocks == 1 and bm.num_live_blocks(0) == 3
    _run(bm, seq, 4)  # query 16 reads from 11 on: block 1 goes too
    assert bm.block_table(0) == (NULL_BLOCK, NULL_BLOCK, 2, 3, 4)
    seq.append_token(99)
    _run(bm, seq, 1)  # the decode of token 20 reads from 15 on
    assert bm.block_table(0) == (NULL_BLOCK, NULL_BLOCK, NULL_BLOCK, 3, 4, 5)
    assert bm.check_integrity() == {"used": 3, "cached": 3, "free": 2}
    bm.free(seq)
    assert bm.check_integrity() == {"used": 0, "cached": 5, "free": 3}
    # the same tokens again: a hit of 5 blocks needs only blocks 3 and 4 (query 20 reads from 15 on)
    again = Sequence(1, list(range(100, 120)) + [99, 7])
    hit = bm.get_computed_blocks(again)
    assert hit == [NULL_BLOCK, NULL_BLOCK, NULL_BLOCK, 3, 4]
    assert bm.allocate_slots(again, 2, hit) and again.num_computed_tokens == 20
    assert bm.block_table(1) == (NULL_BLOCK, NULL_BLOCK, NULL_BLOCK, 3, 4, 5)
    assert bm.check_integrity() == {"used": 3, "cached": 3, "free": 2}
    bm.free(again)
    assert bm.check_integrity()["used"] == 0


def test_decode_releases_one_block_per_block_of_tokens():
    bm = BlockManager(4, 4, enable_prefix_caching=False, sliding_window=3)
    seq = Sequence(0, [5])
    _run(bm, seq, 1)
    for t in range(1, 40):  # a 40-token decode through a 4-block pool: never more than 2 blocks live
        seq.append_token(t)
        _run(bm, seq, 1)
        assert bm.num_live_blocks(0) <= 2 and len(bm.block_table(0)) == t // 4 + 1
    assert bm.block_table(0) == (NULL_BLOCK,) * 9 + bm.block_table(0)[9:]  # query 39 reads from 37 on: block 9
    assert bm.num_used_blocks == 1


def _hybrid() -> tuple[BlockManager, BlockManager, KVCacheManager]:
    full, sliding = BlockManager(16, 4), BlockManager(5, 4, sliding_window=6)
    return full, sliding, KVCacheManager([full, sliding])


def test_mixed_hit_needs_the_window_in_every_group():
    full, sliding, kv = _hybrid()
    a = Sequence(0, list(range(100, 118)))
    for n in (8, 8, 2):
        _run(kv, a, n)
    assert kv.group_tables(0) == ((0, 1, 2, 3, 4), (NULL_BLOCK, NULL_BLOCK, 2, 3, 4))
    kv.free(a)
    other = Sequence(1, list(range(200, 208)))
    _run(kv, other, 8)  # evicts the sliding pool's cached blocks 4 (not cached) and 1
    assert kv.group_tables(1) == ((4, 5), (4, 1))
    # 4 blocks of a's tokens: the full group has them all; the sliding window of query 16 needs only 2 and 3
    b = Sequence(2, list(range(100, 118)) + [1, 2, 3])
    assert kv.get_computed_blocks(b) == [[0, 1, 2, 3], [NULL_BLOCK, NULL_BLOCK, 2, 3]]
    # 3 blocks in the full group, but the sliding window of query 12 needs block 1, evicted: the hit shrinks
    # to the one block both groups have
    c = Sequence(3, list(range(100, 112)) + [1, 2])
    assert full.get_computed_blocks(c) == [0, 1, 2] and sliding.get_computed_blocks(c) == [0]
    hit = kv.get_computed_blocks(c)
    assert hit == [[0], [0]]
    assert not kv.allocate_slots(c, 10, hit)  # 4 sliding blocks; 3 are free (0, 3 and 2, cached)
    assert kv.group_tables(3) == ((), ()) and c.num_computed_tokens == 0
    assert kv.allocate_slots(c, 8, hit) and c.num_computed_tokens == 4
    assert kv.group_tables(3) == ((0, 6, 7), (0, 3, 2))
    kv.check_integrity()
    for s in (other, c):
        kv.free(s)
    assert kv.check_integrity()["used"] == 0


def test_admission_needs_every_group():
    full, sliding = BlockManager(16, 4), BlockManager(2, 4, sliding_window=6)
    kv = KVCacheManager([full, sliding])
    seq = Sequence(0, list(range(12)))
    assert not kv.allocate_slots(seq, 12)  # 3 sliding blocks for the chunk: the sliding pool has 2
    assert kv.group_tables(0) == ((), ()) and kv.check_integrity()["used"] == 0
    assert kv.allocate_slots(seq, 8)
    with pytest.raises(ValueError, match=r"group 1 \(window 6\).*fewer than max_model_len"):
        Scheduler(kv, max_num_seqs=2, max_num_batched_tokens=16, max_model_len=64)


# ------------------------------------------------------------------ random workloads
@st.composite
def workloads(draw):
    block_size = draw(st.sampled_from([2, 4]))
    window = draw(st.integers(1, 12))
    max_model_len = draw(st.integers(block_size, 48))
    budget = draw(st.integers(1, 24))
    need = blocks_per_seq(window, max_model_len, block_size, budget)
    num_full = draw(st.integers(-(-max_model_len // block_size), 30))
    num_sliding = draw(st.integers(need, need + 12))
    prefix = draw(st.lists(st.integers(0, 3), max_size=2 * block_size))
    reqs = []
    for _ in range(draw(st.integers(1, 8))):
        max_tokens = draw(st.integers(1, max(1, max_model_len // 2)))
        room = max_model_len - max_tokens
        suffix = draw(st.lists(st.integers(4, 99), max_size=max(0, room)))
        prompt = ((prefix if draw(st.booleans()) else []) + suffix)[:room] or [5]
        reqs.append((draw(st.integers(0, 10)), prompt, max_tokens))
    cfg = dict(max_num_seqs=draw(st.integers(1, 6)), max_num_batched_tokens=budget,
               long_prefill_threshold=draw(st.sampled_from([0, 3])))
    return block_size, window, max_model_len, num_full, num_sliding, draw(st.booleans()), reqs, cfg


def _check_runner_tables(kv: KVCacheManager, batch: InputBatch, out) -> None:
    """Wherever this step's queries read (their windows in the sliding group) or write, the runner's tables hold
    the managers' blocks."""
    window = kv.managers[1].sliding_window
    bs = kv.block_size
    for row in out.rows:
        slot = batch.slots[row.seq_id]
        end = row.num_computed_tokens + len(row.token_ids)
        full, sliding = kv.group_tables(row.seq_id)
        first = max(0, row.num_computed_tokens - window + 1) // bs
        assert list(batch.block_table[slot, :len(full)]) == list(full)
        assert list(batch.group_block_tables[0][slot, first:(end - 1) // bs + 1]) == list(
            sliding[first:(end - 1) // bs + 1])
        assert NULL_BLOCK not in sliding[first:]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_random_workloads_keep_group_invariants(workload):
    block_size, window, max_model_len, num_full, num_sliding, caching, reqs, cfg = workload
    kv = KVCacheManager([BlockManager(num_full, block_size, caching),
                         BlockManager(num_sliding, block_size, caching, sliding_window=window)])
    sched = Scheduler(kv, max_model_len=max_model_len, eos_token_ids=[0], **cfg)
    batch = InputBatch(cfg["max_num_seqs"], max_model_len, block_size, num_groups=2)
    pending = sorted(reqs, key=lambda r: r[0])
    seqs: dict[int, Sequence] = {}
    step = 0
    while pending or not sched.is_finished():
        while pending and pending[0][0] <= step:
            _, prompt, max_tokens = pending.pop(0)
            seq = new_seq(prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
            seqs[seq.seq_id] = seq
            sched.add(seq)
        out = sched.schedule()
        batch.update(out)
        batch.check_integrity()
        _check_runner_tables(kv, batch, out)
        if not sched.is_finished():
            assert out.num_batched_tokens > 0, "a step with unfinished work computed nothing"
        sched.update_from_output(out, fake_tokens(out))
        sched.check_integrity()  # every group's ref counts, the windows covered, the tables aligned
        for seq in sched.running:  # a sliding table holds no more than its window and the step's chunk reach
            assert kv.managers[1].num_live_blocks(seq.seq_id) <= blocks_per_seq(
                window, seq.num_tokens, block_size, cfg["max_num_batched_tokens"])
        step += 1
        assert step < 10_000
    for seq in seqs.values():
        assert seq.finish_reason == "length"
    assert kv.check_integrity()["used"] == 0  # every block back


# ------------------------------------------------------------------ the engine: Gemma 3
LONG = [[(11 * i + 5 * j + 3) % 380 for j in range(150 + 9 * i)] for i in range(8)]  # 150..213 tokens
LONG_GREEDY = SamplingParams(temperature=0, ignore_eos=True, max_tokens=16)


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory) -> str:
    from tests.helpers.gemma3_checkpoints import build_gemma3_checkpoint

    return str(build_gemma3_checkpoint(tmp_path_factory.mktemp("gemma3-hybrid"), seed=3))


def _concurrency(path: str, **kw) -> tuple[list[list[int]], int, object]:
    """Run ``LONG`` on a tiny Gemma 3 with a 32-block budget; its tokens, the most requests running at once and
    the engine."""
    from minivllm import LLM

    llm = LLM(path, device="cpu", dtype="float32", num_kvcache_blocks=32, max_model_len=256,
              max_num_batched_tokens=64, max_num_seqs=8, **kw)
    engine = llm.engine
    ids = [engine.add_request(p, LONG_GREEDY) for p in LONG]
    done, most = {}, 0
    while engine.has_unfinished_requests():
        outputs, stats = engine.step()
        most = max(most, stats.num_running)
        engine.scheduler.check_integrity()
        done.update((o.request_id, o.outputs[0].token_ids) for o in outputs if o.finished)
    return [list(done[i]) for i in ids], most, engine


def test_gemma3_cache_admits_more_long_requests(gemma3):
    """The same budget, 32 blocks of every layer: one full-attention pool of 32 blocks, or the global layer's pool
    (105 blocks) and the five sliding layers' (17 blocks, each sequence holding its 12-token window). The
    hybrid cache runs at least twice as many of the long requests at once; the tokens are transformers'."""
    from tests.helpers.hf_reference import hf_greedy

    full_tokens, full_most, full = _concurrency(gemma3, disable_hybrid_kv_cache_manager=True)
    tokens, most, engine = _concurrency(gemma3)
    assert [w for w, _ in full.executor.kv_cache_groups] == [None]
    assert [w for w, _ in engine.executor.kv_cache_groups] == [None, 12]
    assert full.executor.kv_cache_groups == [(None, 32)] and engine.executor.kv_cache_groups == [(None, 105), (12, 17)]
    # the full layout preempts requests it admitted; the hybrid one runs twice as many, never preempting
    assert most >= 2 * full_most and engine.scheduler.num_preemptions == 0 < full.scheduler.num_preemptions
    assert tokens == full_tokens
    assert all(t == hf_greedy(gemma3, p, 16) for p, t in zip(LONG, tokens))


def test_gemma3_sliding_layers_release_their_blocks(gemma3):
    """A 200-token prompt: once it is computed the sliding layers' table holds only the blocks their window of
    12 tokens reaches (released ones are NULL_BLOCK), the global layer's every block."""
    from minivllm import LLM

    llm = LLM(gemma3, device="cpu", dtype="float32", num_kvcache_blocks=32, max_model_len=256,
              max_num_batched_tokens=64)
    engine = llm.engine
    engine.add_request(LONG[6][:200], LONG_GREEDY)
    full_pool, sliding_pool = engine.block_manager.managers
    assert sliding_pool.sliding_window == 12
    seen_release = False
    while engine.has_unfinished_requests():
        engine.step()
        engine.scheduler.check_integrity()
        for seq in engine.scheduler.running:
            full_table, sliding_table = engine.block_manager.group_tables(seq.seq_id)
            assert len(full_table) == len(sliding_table) and NULL_BLOCK not in full_table
            assert sliding_pool.num_live_blocks(seq.seq_id) <= blocks_per_seq(12, seq.num_tokens, 16, 64)
            if seq.num_computed_tokens >= 200:  # decoding: the window of one query spans at most 2 blocks
                assert sliding_pool.num_live_blocks(seq.seq_id) <= 2 < len(full_table) == full_pool.num_used_blocks
                assert sliding_table[:len(sliding_table) - 2] == (NULL_BLOCK,) * (len(sliding_table) - 2)
                seen_release = True
    assert seen_release
    assert engine.block_manager.check_integrity()["used"] == 0


# ------------------------------------------------------------------ asynchronous scheduling over two groups
class TwoGroupDevice:
    """A fake device with a full and a sliding cache of token values, written and read only through the block
    tables the scheduler's outputs give (kept as the runner's batch keeps them: stale ids of released blocks
    included), one step after another as the GPU's stream runs them. Each row writes its new tokens into both
    caches, then reads its window through the sliding tables: it must read what the full tables read. With
    ``kv`` (synchronous scheduling: the managers are in the step's state), every block read is also live there."""

    def __init__(self, block_size: int, window: int, kv: KVCacheManager | None = None):
        self.bs, self.window, self.manager = block_size, window, kv
        self.kv: list[dict[int, int]] = [{}, {}]  # per group: slot -> the token whose K/V it holds
        self.tables: dict[int, list[list[int]]] = {}  # seq id -> [full table, sliding table]
        self.last: list[int] = []

    def _read(self, group: int, seq_id: int, pos: int) -> int:
        block = self.tables[seq_id][group][pos // self.bs]
        assert block != NULL_BLOCK, f"read position {pos} through a released block"
        if self.manager is not None:
            assert self.manager.group_tables(seq_id)[group][pos // self.bs] == block, f"position {pos}: block gone"
        return self.kv[group][block * self.bs + pos % self.bs]

    def sample(self, out) -> list[int]:
        for seq_id in out.finished_seq_ids:
            del self.tables[seq_id]
        for req in out.new_requests:
            self.tables[req.seq_id] = [list(req.block_ids), list(req.group_block_ids[0])]
        sampled = []
        for row in out.rows:
            tables = self.tables[row.seq_id]
            tables[0] += row.new_block_ids
            tables[1] += (row.new_group_block_ids or ((),))[0]
            new = [self.last[row.prev_sampled_row]] if row.prev_sampled_row >= 0 else list(row.token_ids)
            for i, t in enumerate(new):
                pos = row.num_computed_tokens + i
                for g in (0, 1):
                    self.kv[g][tables[g][pos // self.bs] * self.bs + pos % self.bs] = t
            if row.sampled:
                end = row.num_computed_tokens + len(new)
                context = [self._read(0, row.seq_id, p) for p in range(end)]
                window = [self._read(1, row.seq_id, p) for p in range(max(0, end - self.window), end)]
                assert window == context[len(context) - len(window):]
                sampled.append(4 + (sum(context[-3:]) * 7 + 3 * sum(window) + len(context)) % 50)
        self.last = sampled
        return sampled


def _run_two_groups(workload, async_scheduling: bool) -> dict[int, tuple[list[int], str]]:
    (block_size, num_blocks, max_model_len, reqs, cfg), window, extra = workload
    cfg = dict(cfg)
    caching = cfg.pop("enable_prefix_caching")
    need = blocks_per_seq(window, max_model_len, block_size, cfg["max_num_batched_tokens"])
    kv = KVCacheManager([BlockManager(num_blocks, block_size, caching),
                         BlockManager(need + extra, block_size, caching, sliding_window=window)])
    sched = Scheduler(kv, max_model_len=max_model_len, eos_token_ids=[0], **cfg)
    device = TwoGroupDevice(block_size, window, None if async_scheduling else kv)
    pending = sorted(enumerate(reqs), key=lambda x: x[1][0])
    seqs: dict[int, Sequence] = {}
    inflight, step = None, 0
    while pending or not sched.is_finished() or inflight is not None:
        while pending and pending[0][1][0] <= step:
            i, (_, prompt, max_tokens) = pending.pop(0)
            seqs[i] = new_seq(prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=i % 3 == 0))
            sched.add(seqs[i])
        out = sched.schedule()
        launched = (out, device.sample(out)) if not out.is_empty else None
        previous, inflight = (inflight, launched) if async_scheduling else (launched, None)
        if previous is not None:
            sched.update_from_output(*previous)
        sched.check_integrity()
        step += 1
        assert step < 100_000
    assert kv.check_integrity()["used"] == 0
    return {i: (s.token_ids, s.finish_reason) for i, s in seqs.items()}


@st.composite
def two_group_workloads(draw):
    return draw(single_group_workloads()), draw(st.integers(1, 40)), draw(st.integers(0, 8))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(two_group_workloads())
def test_async_scheduling_over_two_groups_reads_every_window(workload):
    """Random workloads (EOS stops, chunks, prefix hits, preemption) over a full and a sliding pool: every
    window the device reads through the sliding tables holds the tokens the full tables hold, and asynchronous
    scheduling gives the synchronous tokens."""
    assert _run_two_groups(workload, True) == _run_two_groups(workload, False)


@pytest.mark.slow
@pytest.mark.triton
def test_gemma3_triton_kernels_skip_released_blocks(gemma3):
    """attention_backend='triton' (the interpreter): with a sliding pool small enough that released blocks are
    reused by other requests while their old ids stay in the runner's tables, the windowed paged kernels give
    the torch backend's tokens."""
    from minivllm import LLM

    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    prompts = [p[:90] for p in LONG[:3]]
    kw = dict(device="cpu", dtype="float32", num_kvcache_blocks=20, max_model_len=128, max_num_batched_tokens=32)
    with LLM(gemma3, **kw) as ref:
        assert ref.engine.executor.kv_cache_groups[1][0] == 12
        want = [o["token_ids"] for o in ref.generate(prompts, params, use_tqdm=False)]
    with LLM(gemma3, attention_backend="triton", **kw) as llm:
        got = [o["token_ids"] for o in llm.generate(prompts, params, use_tqdm=False)]
    assert got == want
