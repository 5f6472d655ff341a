"""CPU-checkable parts of the NCCL path (the collectives themselves: tests/gpu/test_pynccl_gpu.py)."""

import pytest
import torch

from minivllm.distributed import pynccl
from minivllm.envs import read_envs


def test_missing_library_gives_a_clear_error():
    with pytest.raises(RuntimeError, match="cannot load the NCCL library.*MINIVLLM_NCCL_SO"):
        pynccl.load_library("/nonexistent/libnccl.so.2")


def test_nccl_library_comes_from_the_environment(monkeypatch):
    """``MINIVLLM_NCCL_SO`` is read once into ``Config.envs``, which the engine hands to its groups."""
    monkeypatch.delenv("MINIVLLM_NCCL_SO", raising=False)
    assert read_envs().nccl_library == "libnccl.so.2"
    monkeypatch.setenv("MINIVLLM_NCCL_SO", "/opt/nccl/libnccl.so.2")
    assert read_envs().nccl_library == "/opt/nccl/libnccl.so.2"


def test_collective_inputs_are_checked():
    with pytest.raises(TypeError, match="do not support torch.bool"):
        pynccl.NcclCommunicator._dtype(torch.zeros(4, dtype=torch.bool))
    with pytest.raises(ValueError, match="contiguous"):
        pynccl.NcclCommunicator._dtype(torch.zeros(4, 4).t())
    assert pynccl.NcclCommunicator._dtype(torch.zeros(2, dtype=torch.bfloat16)) == 9  # ncclBfloat16
