"""The torch backend: every kernel of the model's forward and its sampler in plain torch.

The engine runs these on the CPU (``attention_backend="torch"``), and the Triton kernels are checked against
them (hence the ``_ref`` names): the paged KV store and paged attention, the grammar mask, FP8 quantization
and GEMMs. Cache layout per layer: ``[num_blocks, block_size, num_kv_heads, head_dim]``; the
slot of token position ``p`` of a sequence is ``block_table[p // block_size] * block_size +
p % block_size``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

FP8_DTYPES = {"fp8": torch.float8_e4m3fn}


def fp8_max(dtype: torch.dtype) -> float:
    """The largest finite value of an FP8 cache dtype (0.0 for any other dtype)."""
    return float(torch.finfo(dtype).max) if dtype in FP8_DTYPES.values() else 0.0


def store_kvcache_ref(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int, -1 = skip
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Write each token's K/V to its slot; an FP8 cache holds ``K / k_scale`` and ``V / v_scale``."""
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].long()
    sat = fp8_max(k_cache.dtype)
    if sat:  # e4m3 has no infinity: out-of-range values saturate instead of becoming NaN
        key, value = key.float() * (1.0 / k_scale), value.float() * (1.0 / v_scale)
        key, value = key.clamp(-sat, sat), value.clamp(-sat, sat)
    k_flat = k_cache.view(-1, *k_cache.shape[2:])  # [num_blocks * block_size, num_kv_heads, head_dim]
    v_flat = v_cache.view(-1, *v_cache.shape[2:])
    k_flat[slots] = key[valid].to(k_cache.dtype)
    v_flat[slots] = value[valid].to(v_cache.dtype)


def gather_kv_ref(
    cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_table: torch.Tensor,  # [max_blocks] int
    context_len: int,
) -> torch.Tensor:  # [context_len, num_kv_heads, head_dim]
    block_size = cache.shape[1]
    num_blocks = (context_len + block_size - 1) // block_size
    blocks = block_table[:num_blocks].long()
    return cache[blocks].reshape(-1, *cache.shape[2:])[:context_len]


def paged_attention_ref(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    cu_seqlens_q: list[int] | torch.Tensor,  # [num_rows + 1]
    context_lens: list[int] | torch.Tensor,  # [num_rows]
    block_tables: torch.Tensor,  # [num_rows, max_blocks] int
    scale: float,
    sliding_window: int | None = None,
    sinks: torch.Tensor | None = None,  # [num_heads]
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Causal attention of each row's new queries over its cached + new keys (float32 softmax).

    ``sliding_window``: the query at position p sees only keys (p - sliding_window, p] (transformers' rule).
    ``sinks`` (gpt-oss): one logit per head that joins each query's softmax denominator and nothing else."""
    if isinstance(cu_seqlens_q, torch.Tensor):
        cu_seqlens_q = cu_seqlens_q.tolist()
    if isinstance(context_lens, torch.Tensor):
        context_lens = context_lens.tolist()
    num_heads = query.shape[1]
    num_kv_heads = k_cache.shape[2]
    out = torch.empty_like(query)
    for b, ctx in enumerate(context_lens):
        start, end = cu_seqlens_q[b], cu_seqlens_q[b + 1]
        q_len = end - start
        if q_len == 0:
            continue
        # keys before ``lo`` are outside every query's window
        lo = 0 if sliding_window is None else max(0, ctx - q_len + 1 - sliding_window)
        k = gather_kv_ref(k_cache, block_tables[b], ctx)[lo:]  # [ctx - lo, num_kv_heads, head_dim]
        v = gather_kv_ref(v_cache, block_tables[b], ctx)[lo:]
        q = query[start:end].transpose(0, 1).float()  # [num_heads, q_len, head_dim]
        k = k.transpose(0, 1).float().repeat_interleave(num_heads // num_kv_heads, dim=0)
        v = v.transpose(0, 1).float().repeat_interleave(num_heads // num_kv_heads, dim=0)
        q_pos = torch.arange(ctx - q_len, ctx, device=query.device).unsqueeze(1)  # [q_len, 1]
        k_pos = torch.arange(lo, ctx, device=query.device).unsqueeze(0)  # [1, ctx - lo]
        mask = k_pos <= q_pos  # [q_len, ctx - lo]
        if sliding_window is not None:
            mask &= k_pos > q_pos - sliding_window
        if sinks is None:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)  # [num_heads, q_len, head_dim]
        else:
            scores = (q @ k.transpose(1, 2) * scale).masked_fill(~mask, float("-inf"))  # [num_heads, q_len, ctx - lo]
            o = softmax_with_sinks(scores, sinks.float().view(-1, 1, 1)) @ v  # [num_heads, q_len, head_dim]
        out[start:end] = o.transpose(0, 1).to(query.dtype)
    return out


def softmax_with_sinks(scores: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """Softmax of ``scores`` ([..., keys] float32) whose denominator also counts ``exp(sink)`` (``sinks``
    broadcast to ``[..., 1]``): transformers' gpt-oss order, a softmax over the keys and the sink, the sink's
    column dropped."""
    combined = torch.cat([scores, sinks.expand(*scores.shape[:-1], 1)], dim=-1)  # [..., keys + 1]
    combined = combined - combined.amax(dim=-1, keepdim=True)
    return combined.softmax(-1)[..., :-1]


def paged_decode_torch(
    query: torch.Tensor,  # [num_rows, num_heads, head_dim], one query token per row
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    context_lens: list[int],  # [num_rows]
    block_tables: torch.Tensor,  # [num_rows, max_blocks] int, -1 padded
    scale: float,
    sliding_window: int | None = None,
    sinks: torch.Tensor | None = None,  # [num_heads]
) -> torch.Tensor:  # [num_rows, num_heads, head_dim]
    """Decode attention for the whole batch at once (the CPU backend's fast path; same math as
    ``paged_attention_ref``): gather every row's blocks into one padded tensor, mask past each
    row's context (and before its window), one batched softmax in float32 (with each head's sink in its
    denominator where ``sinks`` is given)."""
    num_rows, num_heads, head_dim = query.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    max_ctx = max(context_lens)
    nb = (max_ctx + block_size - 1) // block_size
    blocks = block_tables[:, :nb].long().clamp_min(0)  # [rows, nb]
    k = k_cache[blocks].reshape(num_rows, nb * block_size, num_kv_heads, head_dim)[:, :max_ctx]
    v = v_cache[blocks].reshape(num_rows, nb * block_size, num_kv_heads, head_dim)[:, :max_ctx]
    group = num_heads // num_kv_heads
    q = query.float().view(num_rows, num_kv_heads, group, head_dim)  # [rows, kv, g, d]
    scores = torch.einsum("rkgd,rtkd->rkgt", q, k.float()) * scale  # [rows, kv, g, ctx]
    lens = torch.tensor(context_lens, device=query.device)
    k_pos = torch.arange(max_ctx, device=query.device).unsqueeze(0)  # [1, ctx]
    mask = k_pos < lens.unsqueeze(1)  # [rows, ctx]
    if sliding_window is not None:
        mask &= k_pos >= (lens - sliding_window).unsqueeze(1)
    scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
    if sinks is None:
        probs = scores.softmax(-1)
    else:
        probs = softmax_with_sinks(scores, sinks.float().view(num_kv_heads, group, 1))  # [rows, kv, g, ctx]
    out = torch.einsum("rkgt,rtkd->rkgd", probs, v.float())  # [rows, kv, g, d]
    return out.reshape(num_rows, num_heads, head_dim).to(query.dtype)


def apply_grammar_bitmask_ref(logits: torch.Tensor, rows: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """``logits`` ([B, V] float32, in place): row ``rows[j]`` keeps only the tokens whose bit is set in
    ``bitmask[j]`` ([R, W] int32, token ``t`` at bit ``t % 32`` of word ``t // 32``); the others get ``-inf``."""
    if bitmask.shape[0] == 0:
        return logits
    V = logits.shape[1]
    bits = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    allowed = ((bitmask.unsqueeze(-1) >> bits) & 1).flatten(1)[:, :V].bool()  # [R, V]
    if allowed.shape[1] < V:  # a mask narrower than the logits allows none of the extra columns
        allowed = torch.nn.functional.pad(allowed, (0, V - allowed.shape[1]))
    sub = logits[rows]  # [R, V]
    logits[rows] = sub.masked_fill_(~allowed, float("-inf"))
    return logits


FP8_E4M3_MAX = 448.0


def quantize_fp8_ref(x: torch.Tensor, group: int | None = None,
                     scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic FP8 (e4m3) quantization of ``x`` ([M, K]): one scale per row, or per ``group`` columns of a row
    (``scale``: per-row scales given, ``[M, 1]``, instead of each row's own amax / 448).
    Returns ``(x8 [M, K] float8_e4m3fn, scale [M, 1] or [M, ceil(K / group)] float32)``, ``x ~ x8 * scale``."""
    M, K = x.shape
    g = K if group is None else group
    n = -(-K // g)
    padded = torch.nn.functional.pad(x.float(), (0, n * g - K)).view(M, n, g)  # [M, n, g]
    if scale is None:
        scale = (padded.abs().amax(-1) / FP8_E4M3_MAX).clamp(min=1e-12)  # [M, n]
    # times the reciprocal, as the Triton kernel does, so both round to the same FP8 values
    q = (padded * (1.0 / scale).unsqueeze(-1)).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).view(M, n * g)[:, :K]
    return q.to(torch.float8_e4m3fn), scale


def quantize_weight_fp8_ref(w: torch.Tensor, block: tuple[int, int] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 weights ([N, K]): one scale per output channel (``[N]``), or per ``block`` (``[ceil(N / b0),
    ceil(K / b1)]``)."""
    if block is None:
        q, scale = quantize_fp8_ref(w)
        return q, scale[:, 0]
    b0, b1 = block
    N, K = w.shape
    n0, n1 = -(-N // b0), -(-K // b1)
    padded = torch.nn.functional.pad(w.float(), (0, n1 * b1 - K, 0, n0 * b0 - N)).view(n0, b0, n1, b1)
    scale = (padded.abs().amax(dim=(1, 3)) / FP8_E4M3_MAX).clamp(min=1e-12)  # [n0, n1]
    q = (padded / scale[:, None, :, None]).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).view(n0 * b0, n1 * b1)[:N, :K]
    return q.to(torch.float8_e4m3fn), scale


def dequantize_weight_fp8_ref(w8: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None,
                              dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The ``[N, K]`` weight an FP8 weight and its scales stand for."""
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    if block is None:
        return (w8.to(wide) * scale.view(-1, 1).to(wide)).to(dtype)
    N, K = w8.shape
    full = scale.to(wide).repeat_interleave(block[0], 0)[:N].repeat_interleave(block[1], 1)[:, :K]  # [N, K]
    return (w8.to(wide) * full).to(dtype)


def fp8_linear_ref(x: torch.Tensor, w8: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None,
                   bias: torch.Tensor | None = None, x_scale: torch.Tensor | None = None,
                   out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """An FP8 linear layer in plain torch: ``x`` ([..., K]) quantized per token (per token and ``block[1]``
    columns with block weights, as the FP8 block recipe does; ``x_scale`` [M, 1]: per-token scales given),
    times the dequantized weight. In ``out_dtype`` (default ``x``'s).

    The products are summed in float64, where every term (an e4m3 value times a float32 scale, twice) is
    nearly exact, so the result hardly depends on how K is split: tensor-parallel ranks' partial sums, added,
    round to what one rank computes.
    """
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    q, s = quantize_fp8_ref(x2, None if block is None else block[1], x_scale)
    y = fp8_gemm_ref(q, s, w8, scale, block, bias)  # [M, N] float64
    return y.to(out_dtype or x.dtype).view(*shape[:-1], w8.shape[0])


def fp8_gemm_ref(x8: torch.Tensor, x_scale: torch.Tensor, w8: torch.Tensor, w_scale: torch.Tensor,
                 block: tuple[int, int] | None, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``[M, N]`` float64: FP8 activations ``x8`` [M, K] times their scales ([M, 1], or [M, ceil(K / block[1])])
    by the dequantized FP8 weight, plus ``bias``."""
    K = x8.shape[1]
    g = K if x_scale.shape[1] == 1 else block[1]
    xd = x8.double() * x_scale.double().repeat_interleave(g, 1)[:, :K]  # [M, K]
    y = xd @ dequantize_weight_fp8_ref(w8, w_scale, block, torch.float64).t()  # [M, N]
    return y if bias is None else y + bias.double()
