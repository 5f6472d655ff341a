"""The one-shot all-reduce kernel's protocol, on the CPU: ranks are processes, buffers are shared memory.

Under ``TRITON_INTERPRET=1`` a kernel reads and writes raw host addresses, so processes that map
the same files play the GPUs that map each other's IPC buffers: each runs the real kernel (flags,
epochs, the two buffer halves) on its own mapping addresses. The GPU run is in ``tests/gpu``.
"""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import tempfile
import threading
import time

import pytest
import torch

pytestmark = pytest.mark.triton

CAPACITY = 64 * 1024  # bytes per buffer slot
PROGRAMS = 3
# (numel, dtype): sizes that leave programs idle, span several chunks per program, end mid-block
CALLS = [(1000, torch.float32), (4096, torch.bfloat16), (1, torch.float32), (5000, torch.float16),
         (16384, torch.float32), (37, torch.bfloat16), (3000, torch.float32), (4096, torch.bfloat16),
         (2048, torch.float32)]


def _inputs(call: int, rank: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * call + rank)
    return torch.randn(numel, generator=g).to(dtype)


def expected_sum(call: int, world: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """The kernel's definition: float32, in rank order, one rounding at the end.

    NOTE: Triton's interpreter casts float32 to bfloat16 by dropping the low 16 bits (a GPU rounds
    to nearest even, checked in ``tests/gpu``), so under it the expectation truncates too.
    """
    acc = torch.zeros(numel, dtype=torch.float32)
    for r in range(world):
        acc += _inputs(call, r, numel, dtype).float()
    if dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1":
        return (acc.view(torch.int32) & -65536).view(torch.float32).to(dtype)  # exact: low bits are zero
    return acc.to(dtype)


def _map(path: str, nbytes: int) -> torch.Tensor:
    return torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8)


# fused all-reduce + add + RMSNorm calls, (rows, dim, dtype), between plain ones (the two kernels
# share flags and epochs); float32 / float16: the interpreter's bfloat16 cast truncates. Tiles of
# several rows with masked rows (3, 5, 7 rows), and 30 rows of 1024: 8-row tiles, two per program
NORM_CALLS = {1: (3, 40, torch.float32), 3: (5, 96, torch.float16), 4: (1, 64, torch.float32),
              6: (7, 33, torch.float32), 7: (30, 1024, torch.float16)}
EPS = 1e-6


def _norm_inputs(call: int, rows: int, dim: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(777 + call)
    return torch.randn(rows, dim, generator=g).to(dtype), (torch.rand(dim, generator=g) + 0.5).to(dtype)


def expected_norm(call: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``fused_norm``'s ops on the all-reduce's result: (normalised rows, new residual)."""
    rows, dim, dtype = NORM_CALLS[call]
    total = expected_sum(call, world, rows * dim, dtype).view(rows, dim)
    res, w = _norm_inputs(call, rows, dim, dtype)
    h = (total.float() + res.float()).to(dtype)
    hf = h.float()
    normed = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + EPS)).to(dtype).float()
    return (normed * w.float()).to(dtype), h


def _rank_main(rank: int, world: int, paths: list[tuple[str, str]], queue) -> None:
    try:
        from minivllm.distributed.custom_all_reduce import CustomAllReduce

        maps = [(_map(d, 2 * world * CAPACITY), _map(f, PROGRAMS * world * 4)) for d, f in paths]  # keep mapped
        car = CustomAllReduce(rank, world, [d.data_ptr() for d, _ in maps], [f.data_ptr() for _, f in maps],
                              torch.device("cpu"), CAPACITY, CAPACITY, programs=PROGRAMS, block=1024, num_warps=4)
        car.max_norm_rows = 64  # NOTE: above the default 16, so the 30-row call takes the fused kernel too
        results = []
        for call, (numel, dtype) in enumerate(CALLS):
            if call in NORM_CALLS:
                rows, dim, dtype = NORM_CALLS[call]
                x = _inputs(call, rank, rows * dim, dtype).view(rows, dim)
                res, w = _norm_inputs(call, rows, dim, dtype)
                car.all_reduce_add_rms_norm(x, res, w, EPS)  # in place
                results.append((x, res))
                continue
            x = _inputs(call, rank, numel, dtype)
            car.all_reduce(x)  # in place
            results.append(x)
        buf = io.BytesIO()
        torch.save(results, buf)  # NOTE: as bytes: a tensor in a queue would outlive this process as a shared fd
        queue.put((rank, buf.getvalue(), car.counters.tolist()))
    except Exception as e:  # noqa: BLE001 - reported to the test
        queue.put((rank, repr(e), None))


@pytest.mark.slow  # 8-12 s: spawned processes running the kernel in the interpreter
@pytest.mark.parametrize("world", [2, 3])
def test_one_shot_all_reduce_across_processes(world):
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(dir=shm) as tmp:
        paths = []
        for r in range(world):
            d, f = os.path.join(tmp, f"data{r}"), os.path.join(tmp, f"flags{r}")
            for path, size in ((d, 2 * world * CAPACITY), (f, PROGRAMS * world * 4)):
                with open(path, "wb") as fh:
                    fh.truncate(size)  # zeros: flags start at epoch 0
            paths.append((d, f))
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        procs = [ctx.Process(target=_rank_main, args=(r, world, paths, queue), daemon=True) for r in range(world)]
        for p in procs:
            p.start()
        try:
            got = {}
            for _ in procs:
                rank, results, counters = queue.get(timeout=240)
                got[rank] = (results if isinstance(results, str) else torch.load(io.BytesIO(results)), counters)
        finally:
            for p in procs:
                p.join(timeout=10)
                if p.is_alive():
                    p.kill()
    for rank in range(world):
        results, counters = got[rank]
        assert not isinstance(results, str), f"rank {rank} failed: {results}"
        assert counters == [len(CALLS)] * PROGRAMS  # every program counted every call
        for call, ((numel, dtype), y) in enumerate(zip(CALLS, results)):
            if call in NORM_CALLS:
                (out, res), (want_out, want_res) = y, expected_norm(call, world)
                assert torch.equal(res, want_res), f"rank {rank} call {call}: residual"
                tol = 1e-5 if out.dtype == torch.float32 else 2e-3  # rsqrt / reduction order: an ulp
                torch.testing.assert_close(out, want_out, rtol=tol, atol=tol)
                assert torch.equal(out, got[0][0][call][0])  # the same bits on every rank
                continue
            want = expected_sum(call, world, numel, dtype)
            assert y.dtype == dtype and torch.equal(y, want), f"rank {rank} call {call}"
            assert torch.equal(y, got[0][0][call])  # the same bits on every rank


def _lonely(capacity: int = 4096):
    """Rank 0 of 2 whose peer never comes: buffers are plain tensors in this process."""
    from minivllm.distributed.custom_all_reduce import CustomAllReduce

    bufs = [torch.zeros(2 * 2 * capacity, dtype=torch.uint8) for _ in range(2)]
    flags = [torch.zeros(PROGRAMS * 2, dtype=torch.int32) for _ in range(2)]
    car = CustomAllReduce(0, 2, [b.data_ptr() for b in bufs], [f.data_ptr() for f in flags],
                          torch.device("cpu"), capacity, capacity, programs=PROGRAMS)
    return car, (bufs, flags)


def test_abort_ends_a_wait_for_a_peer_that_never_comes():
    car, keep = _lonely()
    threading.Timer(0.5, car.abort).start()
    t = time.monotonic()
    car.all_reduce(torch.ones(100))
    assert time.monotonic() - t < 60
    assert car.abort_flag.item() == 1
    # the flags it raised for the peer are this call's epoch
    assert keep[1][1].view(PROGRAMS, 2)[:, 0].tolist() == [1] * PROGRAMS


def test_fused_norm_fits_and_clear_errors():
    from minivllm.distributed.custom_all_reduce import FUSED_NORM_MAX_ROWS

    car, _keep = _lonely(capacity=4096)
    x, r, w = torch.ones(4, 64), torch.ones(4, 64), torch.ones(64)
    assert car.fits_add_rms_norm(x, r, w)
    assert not car.fits_add_rms_norm(x, r.half(), w)  # dtypes differ
    assert not car.fits_add_rms_norm(x, torch.ones(4, 32), w)
    assert not car.fits_add_rms_norm(x.view(-1), r.view(-1), w)  # not [M, D]
    assert not car.fits_add_rms_norm(x, r, torch.ones(32))
    assert not car.fits_add_rms_norm(torch.ones(32, 64), torch.ones(32, 64), w)  # 8 KB: over the capacity
    assert car.max_norm_rows == FUSED_NORM_MAX_ROWS == 16
    assert car.fits_add_rms_norm(torch.ones(16, 16), torch.ones(16, 16), torch.ones(16))
    assert not car.fits_add_rms_norm(torch.ones(17, 16), torch.ones(17, 16), torch.ones(16))  # 17 rows: two kernels
    car.max_norm_rows = 3
    assert not car.fits_add_rms_norm(x, r, w)  # 4 rows: more than the fused kernel takes
    with pytest.raises(ValueError, match=r"contiguous \[M <= 3, D <= 8192\] x and residual"):
        car.all_reduce_add_rms_norm(x, r, w, 1e-6)


def test_fits_and_clear_errors():
    car, _keep = _lonely(capacity=4096)
    assert car.fits(torch.ones(1024))  # 4 KB
    assert not car.fits(torch.ones(1025))  # over the capacity: NCCL's
    assert not car.fits(torch.ones(10, dtype=torch.int64))
    assert not car.fits(torch.ones(8, 8).t())
    assert not car.fits(torch.ones(0))
    with pytest.raises(ValueError, match="at most 4096 bytes"):
        car.all_reduce(torch.ones(2000))
    car.close()
    assert not car.fits(torch.ones(4))
    with pytest.raises(ValueError, match="one data and one flag buffer per rank"):
        type(car)(0, 2, [1], [2, 3], torch.device("cpu"), 64, 64)


def test_max_bytes():
    """8 MiB messages at 2 ranks, 2 MiB beyond; never more than a buffer slot holds."""
    from minivllm.distributed.custom_all_reduce import DEFAULT_CAPACITY, default_max_bytes

    assert default_max_bytes(2) == DEFAULT_CAPACITY == 8 << 20
    assert default_max_bytes(3) == default_max_bytes(4) == default_max_bytes(8) == 2 << 20
    car, _keep = _lonely(capacity=4096)
    assert car.max_bytes == 4096  # min(max_bytes, capacity)


def _config(**engine_args):
    from minivllm.config import ArchConfig, Config

    arch = ArchConfig("Qwen3ForCausalLM", vocab_size=448, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    return Config.create("/nonexistent-checkpoint", arch=arch, device="cpu", tensor_parallel_size=2, **engine_args)


@pytest.mark.parametrize("disable", [None, False, True])
def test_disable_custom_all_reduce_reaches_the_group(monkeypatch, disable):
    """The engine argument ``disable_custom_all_reduce`` (default False) reaches every rank's ``TPGroup`` as
    ``custom_all_reduce=not disable``, beside the environment's NCCL library and timeout."""
    from minivllm.worker import tp_worker

    monkeypatch.setenv("MINIVLLM_NCCL_SO", "/opt/nccl/libnccl.so.2")
    monkeypatch.setenv("MINIVLLM_TP_TIMEOUT_S", "42")
    made = []
    monkeypatch.setattr(tp_worker, "TPGroup", lambda *args, **kw: made.append((args, kw)) or "group")
    config = _config() if disable is None else _config(disable_custom_all_reduce=disable)
    assert config.parallel_config.disable_custom_all_reduce is bool(disable)
    assert tp_worker.new_group(config, torch.device("cpu"), 1, "tcp://127.0.0.1:1") == "group"
    (args, kw), = made
    assert args == (torch.device("cpu"), "tcp://127.0.0.1:1", 2, 1)
    assert kw["custom_all_reduce"] is not bool(disable)
    assert (kw["nccl_library"], kw["timeout_s"]) == ("/opt/nccl/libnccl.so.2", 42.0)
