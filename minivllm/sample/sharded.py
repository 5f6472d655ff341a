"""Tensor parallelism: sample each rank's vocabulary slice where it lies.

The gather path moves every rank's ``[rows, V / N]`` logits to rank 0, which
concatenates them and samples the whole vocabulary alone. For a step whose every sampled row the
fused Gumbel pass samples with nothing else to do (``sharded_temperatures``), the ranks instead:

1. before the forward, every rank reads the rows' temperatures (0 for greedy rows) from its own persistent
   batch, which holds the same parameters on every rank (None: this step takes the gather path);
2. rank 0 draws the rows' Philox keys (``gumbel_keys``: the same draws as the unsharded sampler)
   and broadcasts them (an all-greedy step needs none);
3. every rank runs ``gumbel_sample_shard`` on its slice (noise keyed by the GLOBAL token id);
   rank 0 gathers the ``[rows, 2]`` (best, id) pairs and ``pick_across_shards`` gives the tokens.

The tokens are exactly those of the fused sampler on the gathered logits: same keys, same noise and
temperature per token id, and ties to the lowest id at every level.

NOTE: every rank runs the same collectives in the same order, from the same host inputs:
[forward] -> key broadcast (unless every temperature is 0) -> gather of the pairs.

Used at TP > 1 wherever the sampler's Triton kernels run (``DeviceConfig.triton_sampling``), since it beat
gathering every step's logits (docs/performance-notes.md; ``benchmarks/engine/tp_scaling.py`` measures it).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from minivllm.sample.metadata import SAMPLING_EPS, _to_device
from minivllm.sample.sampler import gumbel_keys
from minivllm.sampling_params import SamplingParams


def sharded_temperatures(params: Sequence[SamplingParams], num_generated: Sequence[int], vocab_size: int,
                         fused: bool) -> np.ndarray | None:
    """[rows] float32 temperatures (0.0 on greedy rows) if the sharded path samples this step exactly, else None.

    It does when no row asks for logprobs, has a penalty, a token edit, a grammar or a pending ``min_tokens`` (``num_generated``:
    each row's tokens so far), and every random row takes the fused pass (``fused``: the sampler
    uses it on this device) without top-k / top-p / min-p. An all-greedy step qualifies either way.
    """
    if not params:
        return None
    temps = []
    for p, n in zip(params, num_generated, strict=True):
        if (p.num_logprobs is not None or p.has_penalties or p.edits_logits or n < p.min_tokens
                or p.structured_outputs is not None or p.thinking_token_budget is not None):
            return None
        if p.temperature < SAMPLING_EPS:
            temps.append(0.0)
        elif fused and not 0 < p.top_k < vocab_size and p.top_p >= 1.0 and p.min_p <= 0.0:
            temps.append(p.temperature)
        else:
            return None
    return np.asarray(temps, dtype=np.float32)


class ShardedSampler:
    """One rank's side of the sharded path, over the LM head's vocabulary slice and tensor-parallel group."""

    def __init__(self, head, device: torch.device):
        self.group = head.tp_group
        self.vocab_start = head.vocab_start  # global id of the slice's first column
        self.vocab_size = head.num_embeddings  # ids beyond it are the last slice's zero padding
        self.device = device

    def __call__(self, logits: torch.Tensor, temperatures: np.ndarray, seeded: list[tuple[int, int]] = (),
                 generator: torch.Generator | None = None) -> torch.Tensor | None:
        """Sample ``logits`` ([rows, per_rank], this rank's slice) with ``temperatures`` ([rows], the same on
        every rank); rank 0 passes the rows' ``seeded_keys`` (and the generator of the unseeded rows' keys) and
        gets the [rows] int64 token ids, others None."""
        from minivllm.kernels.gumbel_sample import gumbel_sample_shard, pick_across_shards

        rows = logits.shape[0]
        if temperatures.shape != (rows,):
            raise ValueError(f"temperatures must have one entry per row ({rows}), got shape {temperatures.shape}")
        keys = temps = None
        if temperatures.any():  # NOTE: a host array every rank holds: all ranks take (or skip) the broadcast
            if self.group.rank == 0:
                keys = gumbel_keys(rows, list(seeded), self.device, generator)  # [rows] int64
            else:
                keys = torch.empty(rows, dtype=torch.int64, device=self.device)
            self.group.broadcast(keys, src=0)
            temps = _to_device(temperatures, torch.float32, self.device)  # [rows]
        pair = gumbel_sample_shard(logits, keys, temps, self.vocab_start, self.vocab_size)  # [rows, 2] float64
        parts = self.group.gather(pair, dst=0)  # outside any CUDA graph, as the logits gather
        return None if parts is None else pick_across_shards(parts)
