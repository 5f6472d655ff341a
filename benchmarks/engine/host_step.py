"""Host time of one scheduled decode step, without a model: the scheduler's ``schedule()`` and the runner's
input preparation (block tables, positions, slots, token ids as numpy arrays), at a given number of running
rows and tokens of context per row.

    python benchmarks/engine/host_step.py                     # 256 rows at 1k and 16k tokens of context
    python benchmarks/engine/host_step.py --rows 64 --context 1024 4096 --penalties

Everything here is pure Python and numpy: the figures are the host's share of a step, which the GPU's
forward hides only while it is the shorter of the two. ``--penalties`` gives every row a repetition
penalty (sampling then reads the tokens generated so far). The sampled tokens come from a fake runner (a
fixed function of the step), and ``update_from_output`` is timed apart. Objects made while setting up are frozen
out of the garbage collector's passes (``gc.freeze``, as a server does after start-up).

It runs against the current tree (``InputBatch``, scheduler outputs as deltas) and, for before/after
figures, against trees that predate it (``build_step_inputs`` from whole rows): the same workload either way.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

from minivllm.core.block_manager import BlockManager
from minivllm.core.scheduler import Scheduler
from minivllm.core.sequence import Sequence
from minivllm.sampling_params import SamplingParams

try:  # the runner's persistent batch
    from minivllm.worker.input_batch import InputBatch
except ImportError:  # older trees: inputs rebuilt from whole rows every step
    InputBatch = None
    from minivllm.worker.input_batch import build_step_inputs

BLOCK = 16


class Preparer:
    """The runner's input preparation for one step, in whichever form this tree has."""

    def __init__(self, rows: int, max_model_len: int):
        self.batch = InputBatch(rows, max_model_len, BLOCK) if InputBatch is not None else None

    def __call__(self, out):
        if self.batch is None:
            return build_step_inputs(out, BLOCK)
        self.batch.update(out)
        return self.batch.prepare_inputs(out)


def fake_tokens(out) -> list[int]:
    return [100 + (row.seq_id * 7 + row.num_computed_tokens) % 50 for row in out.sampled]


def measure(rows: int, context: int, steps: int, penalties: bool) -> dict[str, float]:
    """Median milliseconds per decode step of ``rows`` rows at ``context`` tokens each."""
    max_model_len = context + steps + 8
    blocks = rows * (-(-max_model_len // BLOCK) + 1)
    bm = BlockManager(blocks, BLOCK, enable_prefix_caching=True)
    sched = Scheduler(bm, max_num_seqs=rows, max_num_batched_tokens=rows * context, max_model_len=max_model_len,
                      eos_token_ids=[0])
    params = SamplingParams(temperature=0.0, max_tokens=steps + 4, ignore_eos=True,
                            repetition_penalty=1.1 if penalties else 1.0)
    for i in range(rows):  # distinct prompts: no prefix sharing
        sched.add(Sequence(i, [(i * 131 + j) % 30000 + 1 for j in range(context)], params))
    prep = Preparer(rows, max_model_len)
    out = sched.schedule()  # the prefills, all in one step
    prep(out)
    sched.update_from_output(out, fake_tokens(out))
    # NOTE: the setup's millions of token ids would make the collector's full passes land in random steps
    gc.collect()
    gc.freeze()
    times = {"schedule": [], "prepare inputs": [], "update from output": []}
    for _ in range(steps):
        t0 = time.perf_counter()
        out = sched.schedule()
        t1 = time.perf_counter()
        prep(out)
        t2 = time.perf_counter()
        sched.update_from_output(out, fake_tokens(out))
        t3 = time.perf_counter()
        assert len(out.rows) == rows and out.num_decode_tokens == rows, "every row must decode"
        times["schedule"].append(t1 - t0)
        times["prepare inputs"].append(t2 - t1)
        times["update from output"].append(t3 - t2)
    gc.unfreeze()
    res = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    res["schedule + prepare"] = 1e3 * statistics.median(
        [a + b for a, b in zip(times["schedule"], times["prepare inputs"])])
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=256, help="running sequences, all decoding")
    ap.add_argument("--context", type=int, nargs="+", default=[1024, 16384], help="tokens of context per row")
    ap.add_argument("--steps", type=int, default=50, help="decode steps timed (the median is printed)")
    ap.add_argument("--penalties", action="store_true", help="every row has a repetition penalty")
    args = ap.parse_args()
    form = "InputBatch (deltas)" if InputBatch is not None else "build_step_inputs (whole rows)"
    print(f"{args.rows} rows, {form}, penalties {'on' if args.penalties else 'off'}; median ms per step")
    cols = ["schedule", "prepare inputs", "schedule + prepare", "update from output"]
    print(f"| context | {' | '.join(cols)} |")
    print(f"| ---: | {' | '.join('---:' for _ in cols)} |")
    results = {}
    for ctx in args.context:
        results[ctx] = r = measure(args.rows, ctx, args.steps, args.penalties)
        print(f"| {ctx} | {' | '.join(f'{r[c]:.3f}' for c in cols)} |", flush=True)
    if len(args.context) > 1:
        lo, hi = min(args.context), max(args.context)
        print(f"schedule + prepare at {hi} over {lo} tokens: "
              f"{results[hi]['schedule + prepare'] / results[lo]['schedule + prepare']:.2f}x")


if __name__ == "__main__":
    main()
