"""A fake model runner and helpers for driving the Scheduler without a model."""

from itertools import count

from minivllm.core.block_manager import BlockManager
from minivllm.core.scheduler import Scheduler, SchedulerOutput
from minivllm.core.sequence import Sequence
from minivllm.sampling_params import SamplingParams

EOS = 2
_seq_ids = count()


def make_scheduler(num_blocks=64, block_size=16, max_num_seqs=8, budget=64, max_model_len=256, **kw) -> Scheduler:
    bm = BlockManager(num_blocks, block_size, kw.pop("enable_prefix_caching", True))
    return Scheduler(bm, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, max_model_len=max_model_len,
                     eos_token_ids=[EOS], **kw)


def make_seq(prompt_len: int, max_tokens: int = 4, start: int = 10, ignore_eos: bool = True) -> Sequence:
    return Sequence(next(_seq_ids), [start + i for i in range(prompt_len)],
                    SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos, temperature=0))


def new_seq(token_ids: list[int], params: SamplingParams | None = None, **kw) -> Sequence:
    """A sequence with a fresh id (``kw``: ``Sequence``'s other arguments)."""
    return Sequence(next(_seq_ids), token_ids, params, **kw)


def fake_tokens(out: SchedulerOutput) -> list[int]:
    """One deterministic token per sampled row of the step (row order)."""
    return [100 + (row.seq_id * 7 + row.num_computed_tokens + len(row.token_ids)) % 50
            for row in out.rows if row.sampled]


def rows(out: SchedulerOutput) -> list[tuple[int, int]]:
    """``(seq_id, new tokens)`` of each row of the step."""
    return [(row.seq_id, len(row.token_ids)) for row in out.rows]


def step(sched: Scheduler) -> SchedulerOutput:
    out = sched.schedule()
    sched.update_from_output(out, fake_tokens(out))
    sched.check_integrity()
    return out
