"""Tile configurations of the fused MoE kernels (``minivllm.kernels.fused_moe``), and which path a batch takes.

Grouped GEMM configs follow vLLM's scheme: one JSON file per (E, N, device) under ``configs/``, named
``E={E},N={N},device_name={name}.json`` (``N`` the experts' intermediate size on this rank, ``name`` the CUDA
device name with spaces as underscores, e.g. ``NVIDIA_H100_80GB_HBM3``; FP8 experts add ``,dtype=fp8_w8a8``),
mapping a batch size (tokens) to ``{"BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M",
"num_warps", "num_stages"}``; the entry of the nearest batch size is taken at run time. The files are written by
``benchmarks/kernels/tune_fused_moe.py``; with no file for the shape and device, :func:`default_config`.

Small batches take the GEMV-shaped decode kernels, which read only the picked experts' weights and need no
alignment. Their tiles are tuned too (``tune_fused_moe.py --decode``), into ``E=..,N=..,H=..,top_k=..,
device_name=..[,dtype=fp8_w8a8],decode.json``: batch size -> ``[[gate/up tiles], [down tiles, picks]]``, only the
sizes where decode beat the grouped GEMMs, so the largest is where the path changes (:func:`use_decode`). With no
file, batches of at most ``DECODE_MAX_PAIRS`` (token, pick) pairs take it, with :func:`decode_config`'s default.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
#: with no tuned decode file, the most (token, pick) pairs the decode kernels take (two tokens at top-8, eight
#: at top-2); the grouped GEMMs above, whose few row tiles at such sizes leave most SMs idle.
DECODE_MAX_PAIRS = 16


def device_name(device: torch.device | None = None) -> str:
    """The CUDA device's name as config files spell it (spaces as underscores); looked up once per device, since
    every MoE layer asks on every call."""
    index = device.index if isinstance(device, torch.device) else device
    return _device_name(torch.cuda.current_device() if index is None else index)


@functools.cache
def _device_name(index: int) -> str:
    return torch.cuda.get_device_name(index).replace(" ", "_")


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
    table = _grouped_table(num_experts, n, device, fp8, directory)
    if not table:
        return default_config(m, num_experts, top_k)
    return table[min(table, key=lambda size: (abs(size - m), size))]


def decode_file_name(num_experts: int, n: int, hidden: int, top_k: int, device: str, fp8: bool = False) -> str:
    """The file name of the decode kernels' tuned tiles for ``num_experts`` experts ``[2n, hidden]`` /
    ``[hidden, n]`` at top-``top_k`` on ``device``."""
    return (f"E={num_experts},N={n},H={hidden},top_k={top_k},device_name={device}"
            f"{',dtype=fp8_w8a8' if fp8 else ''},decode.json")


def check_decode_tiles(tiles, top_k: int, where: str = "decode_tiles") -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``tiles`` as ``((BLOCK_N, BLOCK_K, NUM_STAGES, num_warps), (BLOCK_N, BLOCK_K, NUM_STAGES, num_warps[,
    picks]))`` of ints; a ValueError naming ``where`` for a bad one (``picks`` must divide ``top_k``)."""
    try:
        gate_up, down = (tuple(int(v) for v in part) for part in tiles)
    except (TypeError, ValueError):
        raise ValueError(f"{where} must be two tuples of ints (gate/up, down), got {tiles!r}") from None
    if len(gate_up) != 4 or len(down) not in (4, 5):
        raise ValueError(f"{where}: gate/up takes (BLOCK_N, BLOCK_K, NUM_STAGES, num_warps) and down the same "
                         f"plus an optional picks, got {tiles!r}")
    for part in (gate_up, down):
        bn, bk, stages, warps = part[:4]
        if bn < 1 or bn & (bn - 1) or bk < 16 or bk & (bk - 1) or stages < 1 or warps < 1 or warps & (warps - 1):
            raise ValueError(f"{where}: BLOCK_N and num_warps must be powers of two, BLOCK_K a power of two of at "
                             f"least 16 and NUM_STAGES positive, got {part}")
    if len(down) == 5 and (down[4] < 1 or top_k % down[4]):
        raise ValueError(f"{where}: picks must divide top_k={top_k}, got {down[4]}")
    return gate_up, down


@functools.cache
def load_decode_configs(path: Path) -> dict[int, tuple[tuple[int, ...], tuple[int, ...]]] | None:
    """The decode tiles in ``path`` by batch size (tokens), or None if there is no such file."""
    if not path.is_file():
        return None
    raw = json.loads(path.read_text())
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"{path}: a fused MoE decode file maps batch sizes to tiles")
    top_k = int(path.name.split("top_k=")[1].split(",")[0])
    return {int(m): check_decode_tiles(tiles, top_k, f"{path} [{m}]") for m, tiles in raw.items()}


@functools.cache
def _grouped_table(num_experts: int, n: int, device: str | None, fp8: bool, directory: Path) -> dict | None:
    """The device's grouped configs for this shape (cached: read once per shape, not per layer and call)."""
    return None if device is None else load_configs(directory / config_file_name(num_experts, n, device, fp8))


@functools.cache
def _decode_table(num_experts: int, n: int, hidden: int, top_k: int, device: str | None, fp8: bool,
                  directory: Path) -> dict | None:
    if device is None:
        return None
    return load_decode_configs(directory / decode_file_name(num_experts, n, hidden, top_k, device, fp8))


def use_decode(m: int, num_experts: int, n: int, hidden: int, top_k: int, device: str | None, fp8: bool = False,
               directory: Path = CONFIG_DIR) -> bool:
    """Whether ``m`` tokens take the decode kernels: up to the largest batch size of the device's decode file
    (the tuner keeps the sizes where decode beat the grouped GEMMs), else up to ``DECODE_MAX_PAIRS`` pairs."""
    table = _decode_table(num_experts, n, hidden, top_k, device, fp8, directory)
    if table:
        return 0 < m <= max(table)
    return 0 < m * top_k <= DECODE_MAX_PAIRS


def decode_config(m: int, num_experts: int, n: int, hidden: int, top_k: int, device: str | None,
                  fp8: bool = False, directory: Path = CONFIG_DIR) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The decode kernels' ``(gate/up, down)`` tiles for ``m`` tokens: the nearest batch size's in the device's
    decode file, else defaults (a few output rows a program, so that even one token's picks spread over every
    SM; the down kernel sums all of a token's picks)."""
    table = _decode_table(num_experts, n, hidden, top_k, device, fp8, directory)
    if table:
        return table[min(table, key=lambda size: (abs(size - m), size))]

    def rows(out_rows: int, k: int) -> tuple[int, int, int, int]:
        return (4 if out_rows <= 2048 else 8), (256 if k >= 256 else 64), 4, 2

    return rows(n, hidden), (*rows(hidden, n), top_k)
