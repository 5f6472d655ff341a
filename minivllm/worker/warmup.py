"""Before a ``ModelRunner``'s first step: run each sampling path once so that no Triton kernel compiles in a
user's first requests (``benchmarks/engine/lazy_compiles.py`` checks that)."""

from __future__ import annotations

import numpy as np
import torch

from minivllm.layers.sampling_metadata import build_sampling_metadata
from minivllm.sampling_params import SamplingParams


@torch.inference_mode()
def warm_sampling(runner) -> None:
    """Run each sampling path once on two dummy rows (every rank together: the paths gather), so their
    Triton kernels compile at start-up rather than in a user's first steps (~0.6 s each on a GPU; on the
    CPU this only checks the paths)."""
    hidden = torch.zeros(2, runner.config.model_config.arch.hidden_size, dtype=runner.dtype, device=runner.device)
    if runner.sharded_sampling:  # NOTE: rank 0 decides from its own flag; every rank has the same
        shard = runner.model.compute_logits(hidden, gather=False)  # [2, per_rank]
        for temps in ((0.0, 0.0), (0.6, 0.0)):  # all greedy (no noise), then noisy
            runner.shard_sampler(shard, np.asarray(temps, dtype=np.float32))
    logits = runner.model.compute_logits(hidden, gather=True)  # [2, vocab] on rank 0, else None
    if logits is None:
        return
    # NOTE: all-greedy batches take torch.argmax: nothing to compile. The last set loads torch's sort, top-k
    # and penalty kernels (lazily loaded CUDA modules: ~0.1 s in a first request)
    filtered = SamplingParams(temperature=0.7, top_p=0.9, top_k=50, repetition_penalty=1.1, logprobs=5)
    for params in ([SamplingParams(temperature=0.6), SamplingParams(temperature=0.0)],
                   [SamplingParams(temperature=1.0)] * 2, [filtered] * 2):
        meta = build_sampling_metadata(params, [()] * 2, [range(0)] * 2, runner.eos_token_ids, runner.device,
                                       runner.vocab_size)
        runner.sampler(logits, meta)
    if runner.device.type == "cuda":
        torch.cuda.synchronize(runner.device)
