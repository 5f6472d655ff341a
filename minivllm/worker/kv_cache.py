"""The paged KV cache of a ``ModelRunner``: sized from free memory (after a profiling forward at the largest
batch on a GPU, from a budget on the CPU), allocated, and bound to the attention layers."""

from __future__ import annotations

import math
import os

import numpy as np
import torch

from minivllm.core.scheduler_output import ScheduledSeq, SchedulerOutput
from minivllm.sampling_params import SamplingParams
from minivllm.worker.input_batch import build_step_inputs


def block_bytes(runner) -> int:
    """Bytes of one KV block over every layer (K and V)."""
    layer = runner.attn_layers[0]
    return (2 * len(runner.attn_layers) * runner.block_size * layer.num_kv_heads * layer.head_dim
            * runner.kv_dtype.itemsize)


def new_cache(runner, num_blocks: int) -> torch.Tensor:  # -> [2, layers, blocks, block_size, kv_heads, head_dim]
    """A zeroed cache. NOTE: zeros, not garbage: attention multiplies the masked-out tail of a block by 0, and
    0 * NaN would be NaN. On the CPU numpy's calloc-backed zeros let the OS hand out zero pages as they are
    first written, instead of writing gigabytes of zeros at start-up (3 s for the demo model's 2 GiB)."""
    layer = runner.attn_layers[0]
    shape = (2, len(runner.attn_layers), num_blocks, runner.block_size, layer.num_kv_heads, layer.head_dim)
    if runner.device.type == "cpu":
        nbytes = math.prod(shape) * runner.kv_dtype.itemsize
        return torch.from_numpy(np.zeros(nbytes, dtype=np.uint8)).view(runner.kv_dtype).view(shape)
    return torch.zeros(shape, dtype=runner.kv_dtype, device=runner.device)


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
    sc, max_model_len = runner.config.scheduler_config, runner.config.model_config.max_model_len
    num_tokens = min(sc.max_num_batched_tokens, sc.max_num_seqs * max_model_len)
    seq_len = min(max_model_len, num_tokens)
    num_seqs = max(1, num_tokens // seq_len)
    per_seq = -(-seq_len // runner.block_size)
    bind_cache(runner, new_cache(runner, num_seqs * per_seq))
    rows = tuple(ScheduledSeq(i, 0, (0,) * seq_len, tuple(range(i * per_seq, (i + 1) * per_seq)), -1,
                              SamplingParams(), 0, None) for i in range(num_seqs))
    logits = runner.execute(build_step_inputs(SchedulerOutput(rows, rows), runner.block_size))
    del logits
    bind_cache(runner, None)
    if runner.device.type == "cuda":
        torch.cuda.synchronize(runner.device)
        torch.cuda.empty_cache()


_FREE_HEADROOM = 512 << 20  # bytes left free after the cache: CUDA graphs, NCCL and cuBLAS workspaces come later


def profile_num_blocks(runner) -> int:
    """Blocks that fit in free memory: GPU after a profiling forward at the largest batch, CPU from a budget."""
    cc, max_num_seqs = runner.config.cache_config, runner.config.scheduler_config.max_num_seqs
    if cc.num_kvcache_blocks is not None:
        return cc.num_kvcache_blocks
    blocks_per_seq = -(-runner.config.model_config.max_model_len // runner.block_size)
    if runner.device.type == "cpu":
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        budget = min(cc.cpu_kvcache_space_gib * 2**30, 0.5 * avail)
        return max(1, min(int(budget // block_bytes(runner)), max_num_seqs * blocks_per_seq + 1))
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(runner.device)
    profiling_forward(runner)
    free, total = torch.cuda.mem_get_info(runner.device)
    stats = torch.cuda.memory_stats(runner.device)
    peak, current = stats["allocated_bytes.all.peak"], stats["allocated_bytes.all.current"]
    # NOTE: gpu_memory_utilization is this engine's share of the GPU (vLLM's meaning), so replicas can share one
    # GPU at 0.45 each; the cache must also fit in what is free now, whoever else holds the rest
    budget = total * cc.gpu_memory_utilization - peak - (torch.cuda.memory_reserved(runner.device) - current)
    available = min(budget, free - _FREE_HEADROOM)
    # NOTE: capped at four times what max_num_seqs full-length sequences can hold (the rest could
    # only keep prefix cache): a tiny model on a large GPU would otherwise get millions of blocks
    return min(int(available // block_bytes(runner)), 4 * max_num_seqs * blocks_per_seq + 1)


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
