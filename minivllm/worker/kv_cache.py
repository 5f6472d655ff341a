"""The paged KV cache: its shape and bytes, how many blocks fit, and binding it to the attention layers.

``ModelRunner`` sizes the cache (after a profiling forward at the largest batch on a GPU, from a budget on the
CPU), allocates it with ``new_cache`` and hands each attention layer its views with ``bind_cache``.
"""

from __future__ import annotations

import math
import os

import numpy as np
import torch

from minivllm.layers.attention import Attention

#: bytes left free after the cache: CUDA graphs, NCCL and cuBLAS workspaces are allocated later
FREE_HEADROOM = 512 << 20


def block_bytes(layers: list[Attention], block_size: int, dtype: torch.dtype) -> int:
    """Bytes of one KV block over every layer (K and V)."""
    return 2 * len(layers) * block_size * layers[0].num_kv_heads * layers[0].head_dim * dtype.itemsize


def new_cache(layers: list[Attention], num_blocks: int, block_size: int, dtype: torch.dtype,
              device: torch.device) -> torch.Tensor:  # -> [2, layers, blocks, block_size, kv_heads, head_dim]
    """A zeroed cache. NOTE: zeros, not garbage: attention multiplies the masked-out tail of a block by 0, and
    0 * NaN would be NaN. On the CPU numpy's calloc-backed zeros let the OS hand out zero pages as they are
    first written, instead of writing the whole cache at start-up."""
    shape = (2, len(layers), num_blocks, block_size, layers[0].num_kv_heads, layers[0].head_dim)
    if device.type == "cpu":
        nbytes = math.prod(shape) * dtype.itemsize
        return torch.from_numpy(np.zeros(nbytes, dtype=np.uint8)).view(dtype).view(shape)
    return torch.zeros(shape, dtype=dtype, device=device)


def bind_cache(layers: list[Attention], cache: torch.Tensor | None) -> None:
    """Give each attention layer its K and V views of ``cache`` (None: empty tensors)."""
    for i, layer in enumerate(layers):
        if cache is None:
            layer.k_cache = layer.v_cache = torch.tensor([])
        else:
            layer.k_cache, layer.v_cache = cache[0, i], cache[1, i]


def cpu_num_blocks(budget_gib: float, block_nbytes: int, max_useful: int) -> int:
    """Blocks of a CPU cache: within ``budget_gib`` and half the memory available now, at most ``max_useful``."""
    avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    budget = min(budget_gib * 2**30, 0.5 * avail)
    return max(1, min(int(budget // block_nbytes), max_useful))


def gpu_num_blocks(device: torch.device, gpu_memory_utilization: float, block_nbytes: int, max_useful: int) -> int:
    """Blocks of a GPU cache, read from the allocator's statistics right after the profiling forward.

    ``gpu_memory_utilization`` is this engine's share of the GPU (vLLM's meaning), so replicas can share
    one GPU; the cache must also fit in what is free now, whoever else holds the rest.
    """
    free, total = torch.cuda.mem_get_info(device)
    stats = torch.cuda.memory_stats(device)
    peak, current = stats["allocated_bytes.all.peak"], stats["allocated_bytes.all.current"]
    budget = total * gpu_memory_utilization - peak - (torch.cuda.memory_reserved(device) - current)
    available = min(budget, free - FREE_HEADROOM)
    return min(int(available // block_nbytes), max_useful)
