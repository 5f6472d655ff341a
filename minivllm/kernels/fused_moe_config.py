"""Tile configurations of the fused MoE kernels (``minivllm.kernels.fused_moe``), and which path a batch takes.

Grouped GEMM configs follow vLLM's scheme: one JSON file per (E, N, device) under ``configs/``, named
``E={E},N={N},device_name={name}.json`` (``N`` the experts' intermediate size on this rank, ``name`` the CUDA
device name with spaces as underscores, e.g. ``NVIDIA_H100_80GB_HBM3``; FP8 experts add ``,dtype=fp8_w8a8``),
mapping a batch size (tokens) to ``{"BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M",
"num_warps", "num_stages"}``; the entry of the nearest batch size is taken at run time. The files are written by
``benchmarks/kernels/tune_fused_moe.py``; with no file for the shape and device, :func:`default_config`.

Small batches (at most ``DECODE_MAX_PAIRS`` (token, pick) pairs) take the GEMV-shaped decode kernels, which
read only the picked experts' weights and need no alignment; :func:`decode_config` gives their tiles.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
#: the most (token, pick) pairs the decode kernels take (two tokens at top-8, eight at top-2); the grouped GEMMs
#: above, whose few row tiles at such sizes leave most SMs idle. Not yet measured:
#: ``benchmarks/kernels/fused_moe_bench.py`` times both paths, to move this bound on a GPU.
DECODE_MAX_PAIRS = 16


def device_name(device: torch.device | None = None) -> str:
    """The CUDA device's name as config files spell it (spaces as underscores)."""
    return torch.cuda.get_device_name(device).replace(" ", "_")


def config_file_name(num_experts: int, n: int, device: str, fp8: bool = False) -> str:
    """The file name of the configs of ``num_experts`` experts of intermediate size ``n`` on ``device``."""
    return f"E={num_experts},N={n},device_name={device}{',dtype=fp8_w8a8' if fp8 else ''}.json"


def check_config(config: dict, where: str = "config") -> dict:
    """``config`` with its six keys as ints; a ValueError naming ``where`` for a missing key or a bad tile."""
    missing = [k for k in KEYS if k not in config]
    if missing:
        raise ValueError(f"{where}: a fused MoE config needs the keys {KEYS}, missing {missing}")
    out = {k: int(config[k]) for k in KEYS}
    for k in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K"):
        if out[k] < 16 or out[k] & (out[k] - 1):
            raise ValueError(f"{where}: {k} must be a power of two of at least 16, got {out[k]}")
    if out["GROUP_SIZE_M"] < 1 or out["num_warps"] < 1 or out["num_stages"] < 1:
        raise ValueError(f"{where}: GROUP_SIZE_M, num_warps and num_stages must be positive, got {out}")
    return out


@functools.cache
def load_configs(path: Path) -> dict[int, dict] | None:
    """The configs in ``path`` by batch size, or None if there is no such file."""
    if not path.is_file():
        return None
    raw = json.loads(path.read_text())
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"{path}: a fused MoE config file maps batch sizes to configs")
    return {int(m): check_config(cfg, f"{path} [{m}]") for m, cfg in raw.items()}


def default_config(m: int, num_experts: int, top_k: int) -> dict:
    """An untuned config for ``m`` tokens: row tiles near the mean rows an expert gets (``m * top_k / E``)."""
    rows = m * top_k / num_experts
    if rows <= 16:
        return dict(zip(KEYS, (16, 64, 64, 1, 4, 3)))
    if rows <= 48:
        return dict(zip(KEYS, (32, 64, 64, 4, 4, 3)))
    return dict(zip(KEYS, (64, 64, 64, 8, 4, 3)))


def get_config(m: int, num_experts: int, n: int, top_k: int, device: str | None, fp8: bool = False,
               directory: Path = CONFIG_DIR) -> dict:
    """The grouped-GEMM config for ``m`` tokens: the nearest batch size's in the device's file, else the
    default. ``device`` None (no CUDA, the interpreter) always takes the default."""
    table = None if device is None else load_configs(directory / config_file_name(num_experts, n, device, fp8))
    if not table:
        return default_config(m, num_experts, top_k)
    return table[min(table, key=lambda size: (abs(size - m), size))]


def use_decode(num_pairs: int) -> bool:
    """Whether ``num_pairs`` (token, pick) pairs take the decode kernels."""
    return 0 < num_pairs <= DECODE_MAX_PAIRS


def decode_config(n: int, k: int) -> tuple[int, int, int, int]:
    """``(BLOCK_N, BLOCK_K, NUM_STAGES, num_warps)`` of a decode kernel over a ``[n, k]`` expert weight: a few
    output rows a program, so that even one token's picks spread over every SM (untuned)."""
    return (4 if n <= 2048 else 8), (256 if k >= 256 else 64), 4, 2
