"""FP8 weights on a GPU: the Triton activation quantizer equals its reference exactly (hardware conversion),
the cuBLASLt FP8 linear equals the torch reference within FP8 tolerance over several shapes, and the engine
with FP8 weights under CUDA graphs gives the eager path's tokens."""

from pathlib import Path

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.kernels.torch_backend import fp8_linear_ref, quantize_fp8_ref, quantize_weight_fp8_ref

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
DEMO = str(Path(__file__).resolve().parents[2] / "models" / "minivllm-demo-py")


@pytest.mark.parametrize("M, K", [(1, 4096), (7, 1000), (256, 4096), (300, 12288)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_activation_quantizer_equals_the_reference(M, K, dtype):
    from minivllm.kernels.fp8_quant import quantize_fp8_per_token

    x = (torch.randn(M, K, device="cuda", generator=torch.Generator("cuda").manual_seed(K)) * 4).to(dtype)
    q, s = quantize_fp8_per_token(x)
    q_ref, s_ref = quantize_fp8_ref(x)
    torch.testing.assert_close(s, s_ref, rtol=1e-6, atol=0)
    assert (q.float() != q_ref.float()).float().mean() < 1e-4  # a value on a rounding tie may go either way


@pytest.mark.parametrize("M", [1, 5, 16, 256])
@pytest.mark.parametrize("N, K", [(4096, 4096), (6144, 4096), (4096, 12288), (1024, 256)])
def test_cublaslt_fp8_linear_equals_the_reference(M, N, K):
    from minivllm.kernels.fp8_quant import quantize_fp8_per_token
    from minivllm.layers.quantization.fp8 import fp8_scaled_mm

    g = torch.Generator("cuda").manual_seed(M + N)
    w8, scale = quantize_weight_fp8_ref(torch.randn(N, K, device="cuda", generator=g) * 0.02, None)
    x = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
    bias = torch.randn(N, device="cuda", generator=g).to(torch.bfloat16)
    got = fp8_scaled_mm(*quantize_fp8_per_token(x), w8, scale, bias, torch.bfloat16).float()
    want = fp8_linear_ref(x.float(), w8, scale, None, bias.float())
    assert ((got - want).norm() / want.norm()) < 1e-2  # the same FP8 operands; bf16 output and accumulation order


def test_engine_fp8_weights_cuda_graphs_equal_eager(tmp_path):
    from tests.helpers.fp8_checkpoints import write_fp8_checkpoint

    block = str(write_fp8_checkpoint(DEMO, tmp_path / "block", "fp8", (128, 128)))
    prompts = ["def fibonacci(n):", "import os\n", "class Stack:", "for i in range("]
    greedy = SamplingParams(temperature=0, ignore_eos=True, max_tokens=48)
    for model, kw in ((DEMO, {"quantization": "fp8"}), (block, {})):
        runs = []
        for eager in (True, False):
            with LLM(model, device="cuda", gpu_memory_utilization=0.3, enforce_eager=eager, **kw) as llm:
                runs.append([o["token_ids"] for o in llm.generate(prompts, greedy, use_tqdm=False)])
        assert runs[0] == runs[1], model


@pytest.mark.parametrize("M", [1, 4, 16])
@pytest.mark.parametrize("N, K", [(6144, 4096), (4096, 12288), (24576, 4096)])
def test_fp8_gemv_equals_the_dequantized_reference(M, N, K):
    from minivllm.kernels.gemv import gemv
    from minivllm.kernels.torch_backend import dequantize_weight_fp8_ref

    g = torch.Generator("cuda").manual_seed(M + N)
    w8, scale = quantize_weight_fp8_ref(torch.randn(N, K, device="cuda", generator=g) * 0.02, None)
    x = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
    got = gemv(x, w8, None, w_scale=scale).float()
    want = x.float() @ dequantize_weight_fp8_ref(w8, scale, None).t()
    assert ((got - want).norm() / want.norm()) < 4e-3  # bf16 output; float32 accumulation


def test_engine_fused_activation_quantization_equals_the_separate_pass(tmp_path, monkeypatch):
    """The norms and SiLU-and-mul hand their FP8 GEMMs quantized rows (one kernel each) and the engine gives
    exactly the tokens of the separate quantization pass, per-channel and 128x128 blocks, with 40 rows a step
    (beyond the GEMV's 16), under CUDA graphs."""
    from minivllm.layers.quantization.fp8 import Fp8LinearMethod
    from tests.helpers.fp8_checkpoints import write_fp8_checkpoint

    block = str(write_fp8_checkpoint(DEMO, tmp_path / "block", "fp8", (128, 128)))
    prompts = [f"def f{i}(x):\n    return" for i in range(40)]
    greedy = SamplingParams(temperature=0, ignore_eos=True, max_tokens=24)
    fused_calls = []
    real = Fp8LinearMethod.input_quant

    def counting(self, layer, rows, device):
        q = real(self, layer, rows, device)
        fused_calls.append(q)
        return q

    for model, kw in ((DEMO, {"quantization": "fp8"}), (block, {})):
        runs = []
        for fused in (True, False):
            monkeypatch.setattr(Fp8LinearMethod, "input_quant",
                                counting if fused else (lambda self, layer, rows, device: None))
            with LLM(model, device="cuda", gpu_memory_utilization=0.3, **kw) as llm:
                runs.append([o["token_ids"] for o in llm.generate(prompts, greedy, use_tqdm=False)])
        assert runs[0] == runs[1], model
    assert any(q is not None for q in fused_calls)  # the fused kernels did run
