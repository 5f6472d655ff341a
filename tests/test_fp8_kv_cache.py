"""FP8 (e4m3) KV cache: the store saturates and rounds like the reference, the attention kernels read
e4m3 caches exactly as the reference does, the quantization error stays small, and the engine runs
with ``kv_cache_dtype="fp8"`` (half the bytes per block of bf16, so twice the blocks per budget)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from minivllm import LLM, SamplingParams  # noqa: E402
from minivllm.kernels.fused_rope import qk_norm_rope  # noqa: E402
from minivllm.kernels.paged_attention import paged_attention  # noqa: E402
from minivllm.kernels.paged_decode import paged_decode_split_kv  # noqa: E402
from minivllm.kernels.torch_backend import paged_attention_ref, store_kvcache_ref  # noqa: E402
from tests.helpers.kernel_checks import gpu_rounding_in_interpreter  # noqa: E402
from tests.test_triton_kernels import DEVICE, TOL, _poisoned, make_batch  # noqa: E402

FP8 = torch.float8_e4m3fn


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.cpu().view(torch.uint8)


@pytest.fixture
def gpu_rounding(monkeypatch):
    """The interpreter's float32 -> e4m3 cast drops the rounding carry into the exponent (1.97 -> 1.0 instead
    of 2.0): patched to round as GPUs and torch do."""
    return gpu_rounding_in_interpreter(monkeypatch)


@pytest.mark.triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("representable", [True, False])
def test_store_into_fp8_cache_matches_reference_and_saturates(dtype, representable, gpu_rounding):
    """The K/V store of the q/k norm + RoPE kernel (position 0: RoPE leaves k as it is; no norm) writes an e4m3
    cache bit for bit as ``store_kvcache_ref``: values beyond +-448 saturate, the others round to nearest even."""
    gen = torch.Generator().manual_seed(7)
    num_tokens, num_heads, kv_heads, head_dim, block_size, num_blocks = 9, 4, 2, 32, 16, 3
    key = torch.randn(num_tokens, kv_heads, head_dim, generator=gen) * 4
    value = torch.randn(num_tokens, kv_heads, head_dim, generator=gen)
    if representable:  # values e4m3 holds exactly: the check is storage and saturation, not rounding
        key, value = key.to(FP8).float(), value.to(FP8).float()
    key, value = key.to(dtype), value.to(dtype)
    key[0, 0, :4] = torch.tensor([1000.0, -1000.0, 448.0, 460.0]).to(dtype)  # beyond e4m3's +-448
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[3] = -1
    shape = (num_blocks, block_size, kv_heads, head_dim)
    k_ref, v_ref = torch.zeros(shape, dtype=FP8), torch.zeros(shape, dtype=FP8)
    store_kvcache_ref(key, value, k_ref, v_ref, slots)
    k_dev, v_dev = torch.zeros(shape, dtype=FP8, device=DEVICE), torch.zeros(shape, dtype=FP8, device=DEVICE)
    query = torch.randn(num_tokens, num_heads, head_dim, generator=gen).to(dtype)
    cos_sin = torch.cat([torch.ones(1, head_dim // 2), torch.zeros(1, head_dim // 2)], -1)  # position 0
    qk_norm_rope(query.to(DEVICE), key.to(DEVICE), torch.zeros(num_tokens, dtype=torch.int64, device=DEVICE),
                 cos_sin.to(DEVICE), kv_store=(value.to(DEVICE), k_dev, v_dev, slots.to(DEVICE)))
    assert torch.equal(_bits(k_dev), _bits(k_ref)) and torch.equal(_bits(v_dev), _bits(v_ref))
    first = k_ref.view(-1, kv_heads, head_dim)[slots[0]].float()[0, :4]
    assert first.tolist() == [448.0, -448.0, 448.0, 448.0]  # saturated, not NaN
    assert not k_ref.float().isnan().any()


def _fp8_batch(rows, nh, nkv, d, bs, seed):
    q, kc, vc, cu, ctx, bt = make_batch(rows, nh, nkv, d, bs, torch.float16, seed=seed)
    return q, kc.to(FP8), vc.to(FP8), cu, ctx, bt, kc, vc  # NOTE: NaN poison survives the cast


@pytest.mark.triton
def test_paged_attention_reads_fp8_cache_like_reference():
    rows = [(5, 21), (1, 40), (16, 16), (3, 70)]
    q, kc, vc, cu, ctx, bt, _, _ = _fp8_batch(rows, 4, 2, 32, 16, seed=11)
    ref = paged_attention_ref(q.cpu(), kc.cpu(), vc.cpu(), cu.cpu(), ctx.cpu(), bt.cpu(), 0.2)
    out = _poisoned(q)
    paged_attention(q, kc, vc, cu, ctx, bt, 0.2, 16, 70, out=out)
    assert not out.isnan().any()
    torch.testing.assert_close(out.float().cpu(), ref.float(), **TOL[torch.float16])


@pytest.mark.triton
@pytest.mark.parametrize("num_splits", [1, 3])
def test_split_kv_decode_reads_fp8_cache_like_reference(num_splits):
    rows = [(1, c) for c in (1, 30, 80, 17)]
    q, kc, vc, cu, ctx, bt, _, _ = _fp8_batch(rows, 4, 2, 32, 16, seed=12)
    ref = paged_attention_ref(q.cpu(), kc.cpu(), vc.cpu(), cu.cpu(), ctx.cpu(), bt.cpu(), 32**-0.5)
    out = _poisoned(q)
    paged_decode_split_kv(q, kc, vc, ctx, bt, 32**-0.5, 80, num_splits=num_splits, out=out, block_n=16)
    torch.testing.assert_close(out.float().cpu(), ref.float(), **TOL[torch.float16])


def test_fp8_quantization_error_is_small():
    """Attention over the e4m3-rounded cache stays close to attention over the fp16 cache."""
    rows = [(4, 64), (1, 33)]
    q, kc8, vc8, cu, ctx, bt, kc16, vc16 = _fp8_batch(rows, 4, 2, 32, 16, seed=13)
    args = (cu.cpu(), ctx.cpu(), bt.cpu(), 32**-0.5)
    exact = paged_attention_ref(q.cpu(), kc16.cpu(), vc16.cpu(), *args).float()
    fp8 = paged_attention_ref(q.cpu(), kc8.cpu(), vc8.cpu(), *args).float()
    err = (fp8 - exact).abs().max().item()
    assert 0 < err < 0.05, err  # e4m3 keeps 3 mantissa bits: ~6% per element, averaged by attention


def test_kv_cache_dtype_is_validated(tiny_tied_model):
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        LLM(tiny_tied_model, device="cpu", kv_cache_dtype="int4")


def test_engine_with_fp8_kv_cache(tiny_tied_model):
    kw = dict(device="cpu", dtype="float32", max_model_len=256, max_num_seqs=32, cpu_kvcache_space_gib=0.0005)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompts = ["hello world", "the quick brown fox", "def f(x):"]
    with LLM(tiny_tied_model, **kw) as full:
        blocks_f32 = full.engine.num_kvcache_blocks
    with LLM(tiny_tied_model, kv_cache_dtype="fp8", **kw) as llm:
        runner = llm.engine.executor.runner
        assert runner.kv_cache.dtype == FP8
        # 1 byte per value instead of 4 (the budget binds, not the cap of max_num_seqs full sequences)
        assert 4 * blocks_f32 <= llm.engine.num_kvcache_blocks < 4 * (blocks_f32 + 1) <= 32 * 16
        first = llm.generate(prompts, params, use_tqdm=False)
        again = llm.generate(prompts, params, use_tqdm=False)
    assert [len(o["token_ids"]) for o in first] == [12, 12, 12]
    assert [o["token_ids"] for o in first] == [o["token_ids"] for o in again]


@pytest.mark.triton
def test_kv_scales_store_and_read_like_reference(gpu_rounding):
    """Per-layer scales: the fused store writes ``K / k_scale`` and ``V / v_scale`` bit for bit as the reference,
    and both attention kernels read them back as attention over the dequantized cache."""
    gen = torch.Generator().manual_seed(21)
    rows = [(1, 30), (1, 47), (1, 5)]
    q, kc, vc, cu, ctx, bt = make_batch(rows, 4, 2, 32, 16, torch.float16, seed=22)
    k_scale, v_scale = 0.37, 2.5
    n = 6
    key, value = torch.randn(n, 2, 32, generator=gen).half() * 3, torch.randn(n, 2, 32, generator=gen).half()
    slots = torch.arange(n) * 5
    caches = [torch.zeros(4, 16, 2, 32, dtype=FP8) for _ in range(2)]
    store_kvcache_ref(key, value, *caches, slots, k_scale, v_scale)
    dev = [torch.zeros(4, 16, 2, 32, dtype=FP8, device=DEVICE) for _ in range(2)]
    cos_sin = torch.cat([torch.ones(1, 16), torch.zeros(1, 16)], -1)
    qk_norm_rope(torch.randn(n, 4, 32, generator=gen).half().to(DEVICE), key.to(DEVICE),
                 torch.zeros(n, dtype=torch.int64, device=DEVICE), cos_sin.to(DEVICE),
                 kv_store=(value.to(DEVICE), *dev, slots.to(DEVICE), k_scale, v_scale))
    assert torch.equal(_bits(dev[0]), _bits(caches[0])) and torch.equal(_bits(dev[1]), _bits(caches[1]))
    expect = (key.float() / k_scale).clamp(-448, 448).to(FP8).float() * k_scale
    got = caches[0].view(-1, 2, 32)[slots].float() * k_scale
    torch.testing.assert_close(got, expect, rtol=0, atol=0)

    kc8, vc8 = kc.to(FP8), vc.to(FP8)
    args = (cu.cpu(), ctx.cpu(), bt.cpu())
    ref = paged_attention_ref(q.cpu(), kc8.cpu().float() * k_scale, vc8.cpu().float() * v_scale, *args, 0.2)
    unified = paged_attention(q, kc8, vc8, None, ctx, bt, 0.2 * k_scale, 1, 47, v_scale=v_scale)
    split = paged_decode_split_kv(q, kc8, vc8, ctx, bt, 0.2 * k_scale, 47, num_splits=2, v_scale=v_scale,
                                  block_n=16)
    for out in (unified, split):
        torch.testing.assert_close(out.float().cpu(), ref.float(), **TOL[torch.float16])


def _with_kv_scales(src: str, out, names: dict[str, float]) -> str:
    import shutil
    from pathlib import Path

    from safetensors.torch import load_file, save_file

    out = Path(out)
    out.mkdir()
    for f in Path(src).iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            shutil.copy(f, out / f.name)
    tensors = {k: v for f in Path(src).glob("*.safetensors") for k, v in load_file(f).items()}
    tensors.update({k: torch.tensor(v) for k, v in names.items()})
    save_file(tensors, out / "model.safetensors")
    return str(out)


def test_checkpoint_kv_scales_load_into_each_layer(tiny_tied_model, tmp_path):
    """vLLM's ``self_attn.k_scale`` / ``v_scale`` and compressed-tensors' ``k_proj.output_scale`` /
    ``v_proj.output_scale`` set each layer's scales; an FP8 cache uses them, a float cache does not; a
    non-positive scale is a ValueError naming it."""
    scales = {"model.layers.0.self_attn.k_scale": 0.25, "model.layers.0.self_attn.v_scale": 0.5,
              "model.layers.1.self_attn.k_proj.output_scale": 0.125, "model.layers.1.self_attn.v_proj.output_scale": 2.0}
    path = _with_kv_scales(tiny_tied_model, tmp_path / "scaled", scales)
    kw = dict(device="cpu", dtype="float32", max_model_len=128, max_num_seqs=4, cpu_kvcache_space_gib=0.0005)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    with LLM(path, kv_cache_dtype="fp8", **kw) as llm:
        layers = [m.self_attn.attn for m in llm.engine.executor.runner.model.model.layers]
        assert [a.kv_scales() for a in layers[:2]] == [(0.25, 0.5), (0.125, 2.0)]
        assert all(a.kv_scales() == (1.0, 1.0) for a in layers[2:])
        out = llm.generate(["hello world"], params, use_tqdm=False)
    assert len(out[0]["token_ids"]) == 8
    with LLM(path, **kw) as llm:
        assert llm.engine.executor.runner.model.model.layers[0].self_attn.attn.kv_scales() == (1.0, 1.0)
    bad = _with_kv_scales(tiny_tied_model, tmp_path / "bad", {"model.layers.0.self_attn.v_scale": 0.0})
    with pytest.raises(ValueError, match="v_scale"):
        LLM(bad, kv_cache_dtype="fp8", **kw)
