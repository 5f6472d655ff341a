"""The one-shot custom all-reduce on 2 (and 4) GPUs: exact sums, mixed with NCCL, inside replayed CUDA graphs."""

import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "lib"))
from rank_procs import run_ranks  # noqa: E402  (benchmarks/lib/rank_procs.py)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")]

SIZES = [(1, torch.bfloat16), (4096, torch.bfloat16), (4097, torch.float16), (300_000, torch.float32),
         (1 << 20, torch.bfloat16), (4096, torch.bfloat16)]


def _input(i: int, rank: int, n: int, dtype, dev) -> torch.Tensor:
    return torch.randn(n, device=dev, generator=torch.Generator(dev).manual_seed(100 * i + rank)).to(dtype)


def _want(i: int, n: int, dtype, dev, world: int) -> torch.Tensor:
    return sum(_input(i, r, n, dtype, dev).float() for r in range(world)).to(dtype)  # rank order, one rounding


def _connect(rank: int, world: int, port: int):
    """In a rank's process: ``(device, NCCL communicator, custom all-reduce)``."""
    import torch.distributed as dist

    from minivllm.distributed.custom_all_reduce import create_custom_all_reduce
    from minivllm.distributed.pynccl import NcclCommunicator

    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=timedelta(seconds=60))
    comm = NcclCommunicator(store, rank, world, dev)
    return dev, comm, create_custom_all_reduce(store, rank, world, dev, lambda t: comm.all_reduce(t, "min"))


def _worker(rank: int, world: int, port: int) -> dict:
    dev, comm, car = _connect(rank, world, port)
    out = {"created": car is not None}
    eager = []
    for i, (n, dtype) in enumerate(SIZES):  # eager, with a NCCL all-reduce between custom ones
        x = _input(i, rank, n, dtype, dev)
        car.all_reduce(x)
        y = torch.ones(3, device=dev)
        comm.all_reduce(y)
        eager.append(bool(torch.equal(x, _want(i, n, dtype, dev, world))) and y.tolist() == [float(world)] * 3)
    out["eager"] = eager
    # a graph with two custom all-reduces and a NCCL one, replayed with new inputs
    a = torch.zeros(8192, device=dev, dtype=torch.bfloat16)
    b = torch.zeros(100_000, device=dev, dtype=torch.float32)
    c = torch.zeros(10, device=dev)
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        for t, f in ((a, car.all_reduce), (b, car.all_reduce), (c, comm.all_reduce)):
            f(t)
    torch.cuda.current_stream(dev).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        car.all_reduce(a)
        comm.all_reduce(c)
        car.all_reduce(b)
    replays = []
    for step in range(5):
        i = 10 + step
        a.copy_(_input(i, rank, a.numel(), a.dtype, dev))
        b.copy_(_input(i + 50, rank, b.numel(), b.dtype, dev))
        c.fill_(rank + step)
        graph.replay()
        torch.cuda.synchronize(dev)
        replays.append(bool(torch.equal(a, _want(i, a.numel(), a.dtype, dev, world)))
                       and bool(torch.equal(b, _want(i + 50, b.numel(), b.dtype, dev, world)))
                       and c.tolist() == [float(world * step + sum(range(world)))] * 10)
    out["replays"] = replays
    out["counters"] = car.counters.tolist()
    del graph
    car.close()
    comm.abort()
    return out


@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.skipif(
    torch.cuda.device_count() < 4, reason="needs 4 CUDA GPUs"))])
def test_custom_all_reduce_exact_eager_and_in_cuda_graph(world):
    results = run_ranks(_worker, world, timeout=120)
    for rank in range(world):
        r = results[rank]
        assert isinstance(r, dict), r
        assert r["created"] and r["eager"] == [True] * len(SIZES) and r["replays"] == [True] * 5
        # 1 setup check + the eager calls + 2 warm-ups + 2 per replay, on every program
        assert set(r["counters"]) == {1 + len(SIZES) + 2 + 2 * 5}


NORM_SHAPES = [(1, 4096), (7, 4096), (256, 4096), (3, 5120), (1000, 4096)]  # 256 / 1000 rows: tiles of 2 rows


def _norm_worker(rank: int, world: int, port: int) -> list:
    from minivllm.kernels.fused_norm import fused_add_rms_norm

    dev, comm, car = _connect(rank, world, port)
    car.max_norm_rows = 1 << 20  # NOTE: the kernel at every size, not only the engine's (<= 16 rows by default)
    out = []
    for i, (m, d) in enumerate(NORM_SHAPES):
        x = _input(i, rank, m * d, torch.bfloat16, dev).view(m, d)
        res = _input(i + 100, 0, m * d, torch.bfloat16, dev).view(m, d)  # the same residual on every rank
        w = _input(i + 200, 0, d, torch.bfloat16, dev)
        ref_x, ref_res = x.clone(), res.clone()
        car.all_reduce(ref_x)
        fused_add_rms_norm(ref_x, ref_res, w, 1e-6, inplace=True)
        car.all_reduce_add_rms_norm(x, res, w, 1e-6)
        out.append((bool(torch.equal(res, ref_res)), int((x != ref_x).sum()), x.numel()))
    car.close()
    comm.abort()
    return out


def test_fused_all_reduce_add_rms_norm_equals_the_two_kernels():
    """The fused kernel against ``all_reduce`` then ``fused_add_rms_norm``: the same residual bits, and the
    normalised rows equal but for rare one-ulp differences of the float32 reduction order."""
    results = run_ranks(_norm_worker, 2, timeout=120)
    for rank in (0, 1):
        r = results[rank]
        assert isinstance(r, list), r
        for (m, d), (res_equal, mismatches, n) in zip(NORM_SHAPES, r):
            assert res_equal and mismatches <= n // 1000, (rank, m, d, mismatches)
