"""A fake model runner and helpers for driving the Scheduler without a model."""

from minivllm.engine.block_manager import BlockManager
from minivllm.engine.scheduler import Scheduler, SchedulerOutput
from minivllm.engine.sequence import Sequence
from minivllm.sampling_params import SamplingParams

EOS = 2


def make_scheduler(num_blocks=64, block_size=16, max_num_seqs=8, budget=64, max_model_len=256, **kw) -> Scheduler:
    bm = BlockManager(num_blocks, block_size, kw.pop("enable_prefix_caching", True))
    return Scheduler(bm, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, max_model_len=max_model_len,
                     eos_token_ids=[EOS], **kw)


def make_seq(prompt_len: int, max_tokens: int = 4, start: int = 10, ignore_eos: bool = True) -> Sequence:
    return Sequence([start + i for i in range(prompt_len)],
                    SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos, temperature=0))


def fake_tokens(out: SchedulerOutput) -> list[int]:
    """One deterministic token per row whose tokens are all computed after this step."""
    return [100 + (seq.seq_id * 7 + seq.num_tokens) % 50
            for seq, n in out.scheduled if seq.num_computed_tokens + n == seq.num_tokens]


def step(sched: Scheduler) -> SchedulerOutput:
    out = sched.schedule()
    sched.postprocess(out, fake_tokens(out))
    sched.check_integrity()
    return out
