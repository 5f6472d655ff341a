"""The ctypes NCCL communicator on 2 GPUs: eager collectives, and the same inside a replayed CUDA graph."""

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


def _worker(rank: int, world: int, port: int) -> dict:
    import torch.distributed as dist

    from minivllm.distributed.pynccl import NcclCommunicator

    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=timedelta(seconds=60))
    comm = NcclCommunicator(store, rank, 2, dev)
    out = {}
    x = torch.full((1000,), float(rank + 1), device=dev, dtype=torch.bfloat16)
    comm.all_reduce(x)
    out["sum"] = x.float().unique().tolist()  # [1 + 2] everywhere
    m = torch.tensor([10 - rank], device=dev, dtype=torch.int64)
    comm.all_reduce(m, op="min")
    out["min"] = m.item()  # 9
    b = torch.arange(5, device=dev, dtype=torch.int64) * (rank + 1)
    comm.broadcast(b, src=0)
    out["bcast"] = b.tolist()  # rank 0's
    parts = comm.gather(torch.full((3,), rank, device=dev, dtype=torch.float32), dst=0)
    out["gather"] = None if parts is None else [p.tolist() for p in parts]
    # a CUDA graph holding an all-reduce, replayed with new inputs
    static = torch.zeros(4096, device=dev)
    y = torch.zeros(4096, device=dev)
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):  # warm-up outside capture, as the engine does
        y.copy_(static * 2)
        comm.all_reduce(y)
    torch.cuda.current_stream(dev).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y.copy_(static * 2)
        comm.all_reduce(y)
    replays = []
    for step in range(3):
        static.fill_(float(step + rank))
        graph.replay()
        torch.cuda.synchronize(dev)
        replays.append(y[0].item())  # 2*(step+0) + 2*(step+1)
    out["replays"] = replays
    del graph  # NOTE: NCCL waits for graphs holding its kernels before it frees the communicator
    comm.abort()
    assert not comm.alive
    return out


def test_pynccl_collectives_eager_and_in_cuda_graph():
    results = run_ranks(_worker, 2, timeout=120)
    for rank in (0, 1):
        assert isinstance(results[rank], dict), results[rank]
        r = results[rank]
        assert r["sum"] == [3.0] and r["min"] == 9 and r["bcast"] == [0, 1, 2, 3, 4]
        assert r["replays"] == [2.0, 6.0, 10.0]
    assert results[0]["gather"] == [[0.0] * 3, [1.0] * 3] and results[1]["gather"] is None
