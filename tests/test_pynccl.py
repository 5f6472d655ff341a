"""CPU-checkable parts of the NCCL path choice (the collectives themselves: tests/gpu/test_pynccl_gpu.py)."""

import pytest

from minivllm.utils import pynccl
from minivllm.utils.tp_switches import nccl_comm_kind, tp_cuda_graphs_enabled


def test_missing_library_gives_a_clear_error(monkeypatch):
    monkeypatch.setattr(pynccl, "_lib", None)
    monkeypatch.setenv("MINIVLLM_NCCL_SO", "/nonexistent/libnccl.so.2")
    with pytest.raises(RuntimeError, match="cannot load the NCCL library.*MINIVLLM_NCCL_SO"):
        pynccl.load_library()


@pytest.mark.parametrize("comm, forced, kind, graphs", [
    (None, None, "pynccl", True), ("c10d", None, "c10d", False), ("c10d", "1", "c10d", True),
    ("pynccl", "0", "pynccl", False)])
def test_comm_kind_and_graph_switch(monkeypatch, comm, forced, kind, graphs):
    for name, value in (("MINIVLLM_TP_COMM", comm), ("MINIVLLM_TP_CUDA_GRAPHS", forced)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert nccl_comm_kind() == kind and tp_cuda_graphs_enabled() is graphs


def test_unknown_comm_kind_is_rejected(monkeypatch):
    monkeypatch.setenv("MINIVLLM_TP_COMM", "mpi")
    with pytest.raises(ValueError, match="MINIVLLM_TP_COMM"):
        nccl_comm_kind()


def test_collective_inputs_are_checked():
    import torch

    with pytest.raises(TypeError, match="do not support torch.bool"):
        pynccl.NcclCommunicator._dtype(torch.zeros(4, dtype=torch.bool))
    with pytest.raises(ValueError, match="contiguous"):
        pynccl.NcclCommunicator._dtype(torch.zeros(4, 4).t())
    assert pynccl.NcclCommunicator._dtype(torch.zeros(2, dtype=torch.bfloat16)) == 9  # ncclBfloat16
