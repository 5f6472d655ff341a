"""What a ``ModelRunner`` does once before its first step: size and allocate the paged KV cache (after a
profiling forward at the largest batch on a GPU), and run each sampling path once so that no kernel
compiles in a user's first requests (``benchmarks/lazy_compiles.py`` checks that)."""

from __future__ import annotations

import os

import numpy as np
import torch

from minivllm.engine.scheduler import SchedulerOutput
from minivllm.engine.sequence import Sequence
from minivllm.engine.step_inputs import build_step_inputs
from minivllm.layers.sampling_metadata import build_sampling_metadata
from minivllm.sampling_params import SamplingParams


def block_bytes(runner) -> int:
    """Bytes of one KV block over every layer (K and V)."""
    layer = runner.attn_layers[0]
    return (2 * len(runner.attn_layers) * runner.block_size * layer.num_kv_heads * layer.head_dim
            * runner.kv_dtype.itemsize)


def new_cache(runner, num_blocks: int) -> torch.Tensor:  # -> [2, layers, blocks, block_size, kv_heads, head_dim]
    layer = runner.attn_layers[0]
    return torch.zeros(2, len(runner.attn_layers), num_blocks, runner.block_size, layer.num_kv_heads,
                       layer.head_dim, dtype=runner.kv_dtype, device=runner.device)


def bind_cache(runner, cache: torch.Tensor | None) -> None:
    """Give each attention layer its K and V views of ``cache`` (None: empty tensors)."""
    runner.kv_cache = cache
    for i, layer in enumerate(runner.attn_layers):
        if cache is None:
            layer.k_cache = layer.v_cache = torch.tensor([])
        else:
            layer.k_cache, layer.v_cache = cache[0, i], cache[1, i]


@torch.inference_mode()
def profiling_forward(runner) -> None:
    """One forward at the largest batch (through a throw-away cache) to measure peak activations; the layers
    are left without a cache."""
    cfg = runner.config
    num_tokens = min(cfg.max_num_batched_tokens, cfg.max_num_seqs * cfg.max_model_len)
    seq_len = min(cfg.max_model_len, num_tokens)
    num_seqs = max(1, num_tokens // seq_len)
    blocks = num_seqs * -(-seq_len // runner.block_size)
    bind_cache(runner, new_cache(runner, blocks))
    out = SchedulerOutput()
    for i in range(num_seqs):
        seq = Sequence([0] * seq_len)
        seq.block_table = list(range(i * (blocks // num_seqs), (i + 1) * (blocks // num_seqs)))
        out.scheduled.append((seq, seq_len))
    logits = runner.execute(build_step_inputs(out, runner.block_size))
    del logits
    bind_cache(runner, None)
    if runner.device.type == "cuda":
        torch.cuda.synchronize(runner.device)
        torch.cuda.empty_cache()


def profile_num_blocks(runner) -> int:
    """Blocks that fit in free memory: GPU after a profiling forward at the largest batch, CPU from a budget."""
    cfg = runner.config
    if cfg.num_kvcache_blocks is not None:
        return cfg.num_kvcache_blocks
    blocks_per_seq = -(-cfg.max_model_len // runner.block_size)
    if runner.device.type == "cpu":
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        budget = min(cfg.cpu_kvcache_space_gib * 2**30, 0.5 * avail)
        return max(1, min(int(budget // block_bytes(runner)), cfg.max_num_seqs * blocks_per_seq + 1))
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(runner.device)
    profiling_forward(runner)
    free, total = torch.cuda.mem_get_info(runner.device)
    stats = torch.cuda.memory_stats(runner.device)
    peak, current = stats["allocated_bytes.all.peak"], stats["allocated_bytes.all.current"]
    used_by_others = total - free - torch.cuda.memory_reserved(runner.device)
    available = total * cfg.gpu_memory_utilization - used_by_others - peak - (
        torch.cuda.memory_reserved(runner.device) - current)
    # NOTE: capped at four times what max_num_seqs full-length sequences can hold (the rest could
    # only keep prefix cache): a tiny model on a large GPU would otherwise get millions of blocks
    return min(int(available // block_bytes(runner)), 4 * cfg.max_num_seqs * blocks_per_seq + 1)


def allocate_kv_cache(runner) -> int:
    """Size the KV cache (the minimum over tensor-parallel ranks), allocate and bind it; returns its blocks."""
    num_blocks = profile_num_blocks(runner)
    if runner.tp_group is not None:
        t = torch.tensor([num_blocks], device=runner.device if runner.device.type == "cuda" else "cpu")
        runner.tp_group.all_reduce(t, op="min")
        num_blocks = int(t.item())
    if num_blocks < 1:
        raise RuntimeError(
            "no memory is left for the KV cache: raise gpu_memory_utilization, lower max_num_batched_tokens, "
            "or use a smaller model")
    bind_cache(runner, new_cache(runner, num_blocks))
    return num_blocks


@torch.inference_mode()
def warm_sampling(runner) -> None:
    """Run each sampling path once on two dummy rows (every rank together: the paths gather), so their
    Triton kernels compile at start-up rather than in a user's first steps (~0.6 s each on a GPU; on the
    CPU this only checks the paths)."""
    hidden = torch.zeros(2, runner.config.model_config.hidden_size, dtype=runner.dtype, device=runner.device)
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
