"""The mixture-of-experts torch path (``kernels/moe_torch.py``) against naive per-token loops, transformers'
routers, and the ``FusedMoE`` layer's tensor-parallel weight slicing."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from minivllm.kernels.moe_torch import fused_moe, select_experts
from minivllm.layers.fused_moe import FusedMoE
from tests.helpers.kernel_checks import rel_err
from tests.helpers.moe_reference import MOE_TOL, fused_moe_naive, select_experts_naive, uneven_routing

H, INTER = 64, 32


def _weights(num_experts: int, dtype: torch.dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    w13 = torch.randn(num_experts, 2 * INTER, H, generator=gen) / H ** 0.5  # [E, 2I, H]
    w2 = torch.randn(num_experts, H, INTER, generator=gen) / INTER ** 0.5  # [E, H, I]
    return w13.to(dtype), w2.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("renormalize", [False, True], ids=["raw", "renorm"])
@pytest.mark.parametrize("num_experts,top_k", [(8, 1), (8, 2), (8, 8), (64, 2), (64, 8)])
def test_select_experts_matches_naive(num_experts, top_k, renormalize, dtype):
    gen = torch.Generator().manual_seed(top_k)
    if dtype == torch.float32:
        logits = torch.randn(37, num_experts, generator=gen)  # [n, E]
    else:  # distinct values that bfloat16 holds exactly: no tie among the experts, whose order would be arbitrary
        logits = (torch.rand(37, num_experts, generator=gen).argsort(-1).float() / 8).to(dtype)
    weights, ids = select_experts(logits, top_k, renormalize)
    ref_w, ref_ids = select_experts_naive(logits, top_k, renormalize)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int32 and ids.shape == (37, top_k)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights, ref_w, rtol=1e-6, atol=1e-7)
    if renormalize:
        torch.testing.assert_close(weights.sum(-1), torch.ones(37), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("arch,norm_topk_prob", [("qwen3_moe", True), ("qwen3_moe", False), ("mixtral", None),
                                                 ("olmoe", False)])
def test_select_experts_is_transformers_router_bitwise(arch, norm_topk_prob):
    """float32 routing weights and ids are exactly those of transformers' routers (softmax, top-k, renorm)."""
    import transformers

    cls, cfg_cls, experts_field = {
        "qwen3_moe": ("Qwen3MoeTopKRouter", "Qwen3MoeConfig", "num_experts"),
        "mixtral": ("MixtralTopKRouter", "MixtralConfig", "num_local_experts"),
        "olmoe": ("OlmoeTopKRouter", "OlmoeConfig", "num_experts")}[arch]
    module = getattr(transformers.models, arch)
    modeling = getattr(module, f"modeling_{arch}")
    kw = {} if norm_topk_prob is None else {"norm_topk_prob": norm_topk_prob}
    cfg = getattr(transformers, cfg_cls)(hidden_size=H, num_experts_per_tok=4, **{experts_field: 16}, **kw)
    router = getattr(modeling, cls)(cfg)
    torch.nn.init.normal_(router.weight, std=0.5, generator=torch.Generator().manual_seed(1))
    x = torch.randn(50, H, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits, hf_weights, hf_ids = router(x)
    weights, ids = select_experts(logits, 4, norm_topk_prob is None or norm_topk_prob)
    assert torch.equal(ids.long(), hf_ids) and torch.equal(weights, hf_weights.float())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("num_tokens", [1, 5, 64])
@pytest.mark.parametrize("num_experts,top_k", [(8, 1), (8, 2), (8, 8), (64, 2), (64, 8)])
def test_fused_moe_matches_naive(num_experts, top_k, num_tokens, dtype):
    """Uneven loads: picks only on the first half of the experts (the rest have no tokens), skewed."""
    w13, w2 = _weights(num_experts, dtype)
    x = torch.randn(num_tokens, H, generator=torch.Generator().manual_seed(num_tokens)).to(dtype)  # [n, H]
    weights, ids = uneven_routing(num_tokens, num_experts, top_k, seed=num_experts + top_k,
                                  used_experts=num_experts // 2)
    if top_k < num_experts:
        assert len(set(ids.flatten().tolist())) < num_experts  # some experts get no token
    out = fused_moe(x, w13, w2, weights, ids)
    ref = fused_moe_naive(x, w13, w2, weights, ids)  # float64
    assert out.dtype == dtype and out.shape == (num_tokens, H)
    assert rel_err(out, ref) < MOE_TOL[dtype]
    # and no worse than the same computation rounded once at the end
    assert rel_err(out, ref) <= 4 * rel_err(ref.to(dtype), ref) + MOE_TOL[torch.float32]


def test_fused_moe_edge_cases():
    w13, w2 = _weights(8, torch.float32)
    empty = fused_moe(torch.empty(0, H), w13, w2, torch.empty(0, 2), torch.empty(0, 2, dtype=torch.int32))
    assert empty.shape == (0, H)
    # every token on one expert, and one token on the last expert only
    x = torch.randn(9, H, generator=torch.Generator().manual_seed(0))
    ids = torch.tensor([[3]] * 8 + [[7]], dtype=torch.int32)
    weights = torch.full((9, 1), 0.5)
    torch.testing.assert_close(fused_moe(x, w13, w2, weights, ids),
                               fused_moe_naive(x, w13, w2, weights, ids).float(), rtol=1e-5, atol=1e-5)
    # a zero weight drops an expert's contribution
    picks = torch.tensor([[3, 5]] * 9, dtype=torch.int32)
    torch.testing.assert_close(fused_moe(x, w13, w2, torch.tensor([[0.5, 0.0]] * 9), picks),
                               fused_moe(x, w13, w2, weights, picks[:, :1]))


def _fake_group(rank: int, size: int):
    """What ``rank_and_size`` reads of a tensor-parallel group (no collective is called by FusedMoE)."""
    return SimpleNamespace(rank=rank, size=size)


@pytest.mark.parametrize("tp_size", [1, 2, 4])
def test_fused_moe_weight_loader_slices_every_expert(tp_size):
    """Each rank holds its slice of every expert's intermediate dimension; the ranks' partial outputs sum to
    the whole layer's."""
    num_experts = 4
    w13_full, w2_full = _weights(num_experts, torch.float32, seed=3)
    gate, up = w13_full[:, :INTER], w13_full[:, INTER:]  # [E, I, H] each, the checkpoint's per-expert tensors
    x = torch.randn(11, H, generator=torch.Generator().manual_seed(4))
    logits = torch.randn(11, num_experts, generator=torch.Generator().manual_seed(5))
    whole = FusedMoE(num_experts, 2, H, INTER, renormalize=True)
    partial = torch.zeros(11, H)
    for rank in range(tp_size):
        layer = FusedMoE(num_experts, 2, H, INTER, renormalize=True,
                         tp_group=_fake_group(rank, tp_size) if tp_size > 1 else None)
        for target in (layer, whole) if rank == 0 else (layer,):
            for e in range(num_experts):
                target.weight_loader(target.w13_weight, gate[e], e, "gate")
                target.weight_loader(target.w13_weight, up[e], e, "up")
                target.weight_loader(target.w2_weight, w2_full[e], e, "down")
        shard = INTER // tp_size
        cols = slice(rank * shard, (rank + 1) * shard)
        assert layer.w13_weight.shape == (num_experts, 2 * shard, H) and layer.w2_weight.shape == (num_experts, H, shard)
        assert torch.equal(layer.w13_weight[:, :shard], gate[:, cols])
        assert torch.equal(layer.w13_weight[:, shard:], up[:, cols])
        assert torch.equal(layer.w2_weight, w2_full[:, :, cols])
        with torch.no_grad():
            partial += layer(x, logits)
    with torch.no_grad():
        torch.testing.assert_close(partial, whole(x, logits), rtol=1e-5, atol=1e-5)
    assert torch.equal(whole.w13_weight, w13_full) and torch.equal(whole.w2_weight, w2_full)


def test_fused_moe_weight_loader_rejects_bad_shard_and_expert():
    layer = FusedMoE(4, 2, H, INTER, renormalize=False)
    with pytest.raises(ValueError, match="shard"):
        layer.weight_loader(layer.w13_weight, torch.zeros(INTER, H), 0, "gate_up")
    with pytest.raises(ValueError, match="expert_id"):
        layer.weight_loader(layer.w13_weight, torch.zeros(INTER, H), 4, "gate")
    with pytest.raises(ValueError, match="divisible|divide"):
        FusedMoE(4, 2, H, 30, renormalize=False, tp_group=_fake_group(0, 4))
