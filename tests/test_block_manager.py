"""BlockManager step by step: exact block ids, ref counts, cache states and eviction order."""

from itertools import count

import pytest

from minivllm.core.block_manager import BlockManager, hash_block
from minivllm.core.sequence import Sequence

BS = 16
_ids = count()


def seq_of(n: int, start: int = 0) -> Sequence:
    return Sequence(next(_ids), list(range(start, start + n)))


def test_allocate_takes_blocks_in_order_and_counts_refs():
    bm = BlockManager(num_blocks=8, block_size=BS)
    a = seq_of(40)  # 3 blocks: 16 + 16 + 8
    assert bm.allocate_slots(a, 40)
    assert bm.block_table(a.seq_id) == (0, 1, 2)
    assert [bm.blocks[i].ref_count for i in range(4)] == [1, 1, 1, 0]
    # the two full blocks are registered in the prefix cache, the partial one is not
    assert bm.blocks[0].hash == hash_block(-1, list(range(16)))
    assert bm.blocks[1].hash == hash_block(bm.blocks[0].hash, list(range(16, 32)))
    assert bm.blocks[2].hash == -1
    assert bm.check_integrity() == {"used": 3, "cached": 0, "free": 5}


def test_allocation_fails_without_side_effects():
    bm = BlockManager(num_blocks=2, block_size=BS)
    a = seq_of(40)
    assert not bm.allocate_slots(a, 40)
    assert bm.block_table(a.seq_id) == () and bm.num_free_blocks == 2
    bm.check_integrity()


def test_prefix_hit_shares_blocks_and_leaves_one_token_to_compute():
    bm = BlockManager(num_blocks=8, block_size=BS)
    a = seq_of(40)
    bm.allocate_slots(a, 40)
    b = Sequence(next(_ids), list(range(32)) + [999] * 5)  # same two first blocks
    hits = bm.get_computed_blocks(b)
    assert hits == [0, 1]
    assert bm.allocate_slots(b, b.num_tokens - 32, hits)
    assert bm.block_table(b.seq_id) == (0, 1, 3)
    assert b.num_computed_tokens == 32 and b.num_cached_tokens == 32
    assert [bm.blocks[i].ref_count for i in range(4)] == [2, 2, 1, 1]
    bm.check_integrity()
    # a prompt of exactly two full blocks hits only the first: one token must be computed
    c = seq_of(32)
    assert bm.get_computed_blocks(c) == [0]


def test_hash_collision_is_verified_against_token_ids():
    bm = BlockManager(num_blocks=4, block_size=BS)
    a = seq_of(20)
    bm.allocate_slots(a, 20)
    # corrupt the registered content: a lookup with the same hash must not trust it
    bm.blocks[0].token_ids = [7] * BS
    assert bm.get_computed_blocks(seq_of(20)) == []


def test_free_keeps_cached_content_and_lru_evicts_tail_first():
    bm = BlockManager(num_blocks=4, block_size=BS)
    a = seq_of(40)  # blocks 0 (full), 1 (full), 2 (partial)
    bm.allocate_slots(a, 40)
    bm.free(a)
    assert bm.block_table(a.seq_id) == () and a.num_computed_tokens == 0
    # partial block 2 goes to the front; cached blocks are appended tail first: 1 then 0
    assert list(bm.free_queue) == [2, 3, 1, 0]
    assert bm.check_integrity() == {"used": 0, "cached": 2, "free": 2}
    # a new unrelated sequence of 3 blocks takes 2, 3, then evicts 1 (the tail of a's prefix)
    b = seq_of(40, start=1000)
    assert bm.allocate_slots(b, 40)
    assert bm.block_table(b.seq_id) == (2, 3, 1)
    assert bm.blocks[0].hash != -1  # the head of a's prefix survived
    assert bm.get_computed_blocks(seq_of(40)) == [0]
    bm.check_integrity()


def test_revived_cached_block_counts_against_free_space():
    bm = BlockManager(num_blocks=3, block_size=BS)
    a = seq_of(33)
    bm.allocate_slots(a, 33)  # blocks 0, 1 full; 2 partial
    bm.free(a)
    b = seq_of(33)
    hits = bm.get_computed_blocks(b)
    assert hits == [0, 1]
    assert bm.allocate_slots(b, 1, hits)  # revives 0 and 1, takes 2 for the last token
    assert bm.block_table(b.seq_id) == (0, 1, 2) and bm.num_free_blocks == 0
    bm.check_integrity()


def test_decode_appends_a_block_only_at_a_boundary():
    bm = BlockManager(num_blocks=4, block_size=BS)
    a = seq_of(16)
    bm.allocate_slots(a, 16)
    a.num_computed_tokens = 16
    a.append_token(5)
    assert bm.allocate_slots(a, 1)
    assert bm.block_table(a.seq_id) == (0, 1)
    a.num_computed_tokens = 17
    a.append_token(6)
    assert bm.allocate_slots(a, 1)
    assert bm.block_table(a.seq_id) == (0, 1)
    bm.check_integrity()


def test_double_free_is_detected():
    bm = BlockManager(num_blocks=2, block_size=BS)
    a = seq_of(4)
    bm.allocate_slots(a, 4)
    bm.blocks[bm.block_table(a.seq_id)[0]].ref_count = 0  # corrupted: another holder already let it go
    with pytest.raises(RuntimeError, match="double free"):
        bm.free(a)


def test_the_block_manager_owns_the_tables():
    bm = BlockManager(num_blocks=8, block_size=BS)
    a, b = seq_of(20), seq_of(40, start=100)
    bm.allocate_slots(a, 20)
    bm.allocate_slots(b, 40)
    assert bm.seq_ids == {a.seq_id, b.seq_id}
    assert bm.block_table(a.seq_id) == (0, 1) and bm.block_table(b.seq_id) == (2, 3, 4)
    bm.free(a)
    assert bm.seq_ids == {b.seq_id} and bm.block_table(a.seq_id) == ()
    bm.free(a)  # freeing a sequence that holds nothing is a no-op
    assert bm.check_integrity() == {"used": 3, "cached": 1, "free": 4}


def test_prefix_caching_off_never_hits():
    bm = BlockManager(num_blocks=8, block_size=BS, enable_prefix_caching=False)
    a = seq_of(40)
    bm.allocate_slots(a, 40)
    assert bm.get_computed_blocks(seq_of(40)) == []
    assert all(b.hash == -1 for b in bm.blocks)
