"""The keyed Gumbel-max watermark (``--watermark-config``, vLLM's ``gumbel`` algorithm; Aaronson's scheme).

A watermarked random row samples ``token = argmax(l + G)`` over its processed logits ``l`` (after temperature,
top-k, top-p and min-p), where the Gumbel noise ``G[t] = -log(-log u[t])`` comes from a pseudorandom function
``u[t] = PRF(key, context, t)`` in ``(0, 1)``: ``context`` is the row's last ``context_width`` generated tokens
(``-1`` before the first). Since ``argmax(l + G)`` with i.i.d. Gumbel noise draws ``softmax(l)``, the output
keeps the model's distribution; but the chosen tokens have large ``u``, which whoever holds the key can test:
:func:`detect` sums ``-log(1 - u)`` over a text's tokens, ``Gamma(n, 1)`` for a text written without the key,
much larger for a watermarked one. A token the model was sure of carries no evidence (any noise picks it):
detection needs text where the model had a choice, and more of it the more predictable the text.

A context that already occurred among the row's recent generated positions (``deduplicate_contexts``) would
draw the same noise again, so the row samples that token without the watermark (a repeated context otherwise
repeats its token, a loop); :func:`detect` skips such positions too.

The PRF: the row's 64-bit key is a BLAKE2b hash of ``(key, context)`` (on the host); ``u[t]`` mixes it with
``t`` by two rounds of MurmurHash3's 32-bit finalizer, in int64 arithmetic that never overflows, so the same
key gives the same noise on every device.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from minivllm.config.sampling import WatermarkConfig

_M32 = 0xFFFFFFFF


def context_of(output: Sequence[int], num_generated: int, width: int) -> tuple[int, ...]:
    """The ``width`` tokens generated before the next one (``output``: the newest generated tokens, all of
    them when fewer than ``width``), ``-1`` before the first."""
    have = min(num_generated, width)
    if len(output) < have:
        raise ValueError(f"the watermark needs the last {have} generated tokens, got {len(output)}")
    tail = tuple(output[len(output) - have:]) if have else ()
    return (-1,) * (width - have) + tail


def is_repeated_context(output: Sequence[int], num_generated: int, width: int, max_history: int | None) -> bool:
    """Whether the next token's context is the context of one of the last ``max_history`` generated positions
    (None: any); ``output`` holds the newest generated tokens (enough of them for those positions)."""
    ctx = context_of(output, num_generated, width)
    offset = num_generated - len(output)  # generated tokens before output[0]
    first = max(offset, 0 if max_history is None else num_generated - max_history)
    for p in range(first, num_generated):
        i = p - offset  # output[i] is generated token p; its context is the `width` tokens before it
        if i >= width:
            if output[i - 1] == ctx[-1] and tuple(output[i - width:i]) == ctx:
                return True
        elif offset == 0 and (-1,) * (width - i) + tuple(output[:i]) == ctx:
            return True
    return False


def row_key(key: int, context: Sequence[int]) -> int:
    """The 64-bit PRF key of one row: a hash of the secret ``key`` and its context."""
    data = key.to_bytes(8, "big") + struct.pack(f"<{len(context)}q", *context)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``x * c mod 2**32`` for int64 ``x`` in ``[0, 2**32)``, in 16-bit halves so that no product overflows."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & _M32


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def uniforms(row_keys: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """``u`` in ``(0, 1)``, float64: ``[R, T]`` for ``row_keys`` ``[R]`` int64 (64-bit keys as two's complement)
    and ``token_ids`` ``[T]`` (every row's candidates) or ``[R, T]``."""
    lo = (row_keys & _M32).unsqueeze(1)  # [R, 1]
    hi = ((row_keys >> 32) & _M32).unsqueeze(1)  # [R, 1]
    t = token_ids.to(torch.int64) & _M32
    h = _fmix32(_mul32(t, 0x9E3779B1) ^ lo)  # [R, T]
    h = _fmix32(h ^ hi)
    return (h.to(torch.float64) + 0.5) / 2.0**32


def keys_tensor(keys: Sequence[int], device: torch.device | str) -> torch.Tensor:
    """[R] int64 of 64-bit ``keys`` (as two's complement)."""
    return torch.tensor([k - (1 << 64) if k >= 1 << 63 else k for k in keys], dtype=torch.int64, device=device)


def gumbel_watermark_sample(logits: torch.Tensor, row_keys: torch.Tensor) -> torch.Tensor:
    """[R] int64: ``argmax(logits + G)`` of processed logits ``[R, V]`` (``-inf`` where filtered) with the rows'
    keyed Gumbel noise."""
    u = uniforms(row_keys, torch.arange(logits.shape[1], device=logits.device))  # [R, V] float64
    noise = -torch.log(-torch.log(u))
    return (logits.to(torch.float64) + noise).argmax(dim=-1)


@dataclass(frozen=True)
class WatermarkDetection:
    """:func:`detect`'s answer: the score, the tokens scored, and the p-value of the score under "written
    without the key" (small: watermarked)."""

    score: float
    num_scored_tokens: int
    p_value: float


def _gamma_survival(score: float, n: int) -> float:
    """``P(X > score)`` for ``X ~ Gamma(n, 1)``: ``exp(-s) * sum_{k<n} s^k / k!``, in log space."""
    if n <= 0 or score <= 0:
        return 1.0
    logs = [k * math.log(score) - math.lgamma(k + 1) for k in range(n)]
    top = max(logs)
    return min(1.0, math.exp(-score + top + math.log(sum(math.exp(v - top) for v in logs))))


def detect(token_ids: Sequence[int], config: WatermarkConfig) -> WatermarkDetection:
    """Test generated ``token_ids`` (the output alone, from its first token) for ``config``'s watermark."""
    keys, targets = [], []
    for n, token in enumerate(token_ids):
        if config.deduplicate_contexts != "none" and is_repeated_context(
                token_ids[:n], n, config.context_width, config.deduplicate_contexts_max_history):
            continue
        keys.append(row_key(config.key, context_of(token_ids[:n], n, config.context_width)))
        targets.append(token)
    if not targets:
        return WatermarkDetection(0.0, 0, 1.0)
    u = uniforms(keys_tensor(keys, "cpu"), torch.tensor(targets).unsqueeze(1)).squeeze(1)  # [n] float64
    score = float((-torch.log1p(-u)).sum())
    return WatermarkDetection(score, len(targets), _gamma_survival(score, len(targets)))

