"""Batched sampling with per-row parameters (vLLM / OpenAI semantics), on the logits' device.

The engine builds one :class:`SamplingMetadata` per step with :func:`build_sampling_metadata` for the
rows it samples, calls ``Sampler()(logits, metadata)`` and moves ``sampled_token_ids`` (and
``logprobs``) to the host with one ``.tolist()``. Every flag that lets the hot path skip work is a
host-side Python bool, so the forward pass never synchronizes with the device.

Processing order and exact formulas, for row ``b`` with raw logits ``l`` (float32):

1. **token edits** (``sample/token_edits.py``) -- ``allowed_token_ids``: ``l[t] = -inf`` for every other
   ``t``; ``logit_bias``: ``l[t] += bias[t]``. Then the **grammar** of a row under structured outputs:
   ``l[t] = -inf`` for every token its bitmask leaves out. Then **bans**: ``l[t] = -inf`` for the last token ``t`` of
   each bad word whose other tokens end the output so far, and, while ``len(output_b) < min_tokens``,
   for every ``t`` in the request's ``stop_token_ids`` and (unless ``ignore_eos``) in the EOS ids.
2. **repetition penalty** ``r`` (HF / vLLM; applies to tokens seen in the prompt OR the output)::

       l[t] = l[t] / r   if seen[t] and l[t] > 0
       l[t] = l[t] * r   if seen[t] and l[t] <= 0

3. **frequency ``f`` / presence ``p`` penalties** (OpenAI; count over the OUTPUT tokens only)::

       l[t] = l[t] - f * count_out[t] - p * (count_out[t] > 0)

   Then a row whose token is **forced** (a spent ``thinking_token_budget`` ending the reasoning) keeps only
   that token: ``l[t] = -inf`` for every other ``t``, ``l[forced] = 0``.

4. **greedy rows** (``temperature < 1e-5``): ``token = argmax(l)`` (after 1-3; 5-8 do not apply).
5. **temperature** ``T``: ``l = l / T``.
6. **top-k** ``k``: keep ``t`` iff ``l[t] >= kth_largest(l)`` (tokens tied with the k-th value
   are all kept), else ``-inf``. ``k = -1`` (or ``k >= V``) keeps everything.
7. **top-p** ``P`` on ``q = softmax(l)`` (after top-k): sort descending, keep token ``t`` iff the
   probability mass of the tokens strictly before it is ``< P`` (the smallest prefix whose mass
   reaches ``P``; the most likely token is always kept). Implemented as the vLLM ascending-sort
   rule ``remove iff cumsum_ascending(q)[t] <= 1 - P``. ``P = 1`` keeps everything.
8. **min-p** ``m`` (after top-k/top-p): keep ``t`` iff ``q[t] >= m * max(q)``, done without
   softmax or sort as ``l[t] >= max(l) + log(m)``.
9. **sampling**: ``probs = softmax(l)``; ``token = argmax(probs / E)`` with ``E[t] ~ Exp(1)`` i.i.d.
   (the exponential race; ``P(token = t) = probs[t]``). Seeded rows draw ``E`` from their own
   generator, seeded from ``(seed, len(output_b))``, so the token depends only on the request
   (never on the batch it is in or on preemption / recompute); the other rows share one batch
   generator (``metadata.generator``, default: torch's global RNG of that device).
   **Fused path** (``Sampler(fused=True)``: where Triton kernels run, see ``DeviceConfig``; faster than
   the unfused steps, see docs/performance-notes.md and ``benchmarks/kernels/sampler.py --fused``) for
   batches without top-k / top-p / min-p: steps 5 and 9 become one Triton pass,
   ``token = argmax(l / T + G)`` with Gumbel noise ``G = -log(-log U)`` from Philox keyed by the row's
   seed (the same distribution, other draws; seeded rows use the key ``(seed, len(output_b))``, others a
   key from the batch generator).
   With tensor parallelism such steps can sample each rank's vocabulary slice where it lies
   (``minivllm.sample.sharded``; the same tokens).
   **Watermark** (``--watermark-config``, ``minivllm.sample.watermark``): a watermarked row takes
   ``token = argmax(l + G)`` after steps 5-8 instead, with Gumbel noise ``G`` keyed by the watermark's key and
   the row's last generated tokens (the same distribution; the unfused path).

Logprobs are ``log_softmax`` of the RAW logits (before 1-8) at the sampled token, and the top
``max_num_logprobs`` alternatives of that same distribution, sorted descending; a row with
``logprob_token_ids`` gets that distribution at its ids instead (vLLM's).

Speculative decoding verifies several positions per row with the same steps: ``process_logits`` (1-3),
``apply_sampling_filters`` (5-8) and ``gather_logprobs`` work on any number of rows of metadata, and
``minivllm.sample.rejection_sampler`` calls them with one metadata row per position.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from minivllm.sample.logits_processors import (
    apply_bans,
    apply_min_p,
    apply_penalties,
    apply_top_k_top_p,
)
from minivllm.sample.metadata import SamplingMetadata, _to_device
from minivllm.sample.token_edits import apply_token_edits
from minivllm.sample.watermark import gumbel_watermark_sample


@dataclass
class LogprobsTensors:
    """The logprobs of one token per sampled position (``gather_logprobs``), each ``None`` where not asked."""

    logprobs: torch.Tensor  # [N] float32, raw log_softmax at the sampled ids
    top_logprobs_ids: torch.Tensor | None = None  # [N, k] int64, sorted by descending logprob
    top_logprobs: torch.Tensor | None = None  # [N, k] float32
    token_id_logprobs: torch.Tensor | None = None  # [N, M] float32, at metadata.logprob_token_ids


@dataclass
class SamplerOutput:
    """The sampler's tokens of a step, one per row, and the logprobs the rows asked for."""

    sampled_token_ids: torch.Tensor  # [B] int64
    logprobs: torch.Tensor | None = None  # [B] float32, raw log_softmax at the sampled ids
    top_logprobs_ids: torch.Tensor | None = None  # [B, k] int64, sorted by descending logprob
    top_logprobs: torch.Tensor | None = None  # [B, k] float32
    token_id_logprobs: torch.Tensor | None = None  # [B, M] float32, at metadata.logprob_token_ids


def _exponential_race(probs: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    noise = torch.empty_like(probs)
    if len(md.seeded) < md.batch_size:
        noise.exponential_(generator=md.generator)
    for row, gen in md.seeded:  # a Python loop over the SEEDED rows only
        noise[row].exponential_(generator=gen)
    # exponential_ can return exactly 0; a zero-probability token must then still lose (0 / tiny = 0).
    noise.clamp_(min=torch.finfo(noise.dtype).tiny)
    return probs.div_(noise).argmax(dim=-1)


def gumbel_keys(batch_size: int, seeded: list[tuple[int, int]], device: torch.device,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """[B] int64 Philox keys: random for unseeded rows (from ``generator``, default torch's RNG of
    ``device``), the ``(row, key)`` pairs of ``seeded`` (see ``seeded_keys``) for the others."""
    seeds = torch.randint(0, 2**62, (batch_size,), dtype=torch.int64, device=device, generator=generator)
    if seeded:
        rows, keys = zip(*seeded)
        seeds[_to_device(list(rows), torch.int64, device)] = _to_device(list(keys), torch.int64, device)
    return seeds


def _gumbel_seeds(md: SamplingMetadata, device: torch.device) -> torch.Tensor:
    """[B] int64 Philox keys of a step: ``gumbel_keys`` with the metadata's seeded rows and batch generator."""
    return gumbel_keys(md.batch_size, md.seeded_keys, device, md.generator)


def apply_grammar(x: torch.Tensor, rows: torch.Tensor, bitmask: torch.Tensor, triton: bool = False) -> None:
    """The grammar's ``-inf`` on ``x`` ([N, V] float32, in place) at ``rows``: one Triton pass with ``triton``
    (where Triton runs), else torch."""
    if triton:
        from minivllm.kernels.grammar_mask import apply_grammar_bitmask

        apply_grammar_bitmask(x, rows, bitmask)
    else:
        from minivllm.kernels.torch_backend import apply_grammar_bitmask_ref

        apply_grammar_bitmask_ref(x, rows, bitmask)


def modifies_logits(md: SamplingMetadata) -> bool:
    """Whether steps 1-3 (or a forced token) change any row's logits."""
    return (md.banned_rows is not None or md.edits is not None or not md.no_penalties
            or md.grammar_rows is not None or md.forced_rows is not None)


def process_logits(logits: torch.Tensor, md: SamplingMetadata, triton: bool = False) -> torch.Tensor:
    """Steps 1-3 and the forced tokens: a float32 copy of ``logits`` ([N, V]; one row of ``md`` per row of it,
    each a position to sample) with token edits, the grammar, bans and penalties applied. ``logits`` itself stays
    raw, for the logprobs."""
    x = logits.to(torch.float32, copy=True)  # [N, V]
    x = apply_token_edits(x, md.edits)
    if md.grammar_rows is not None:
        apply_grammar(x, md.grammar_rows, md.grammar_bitmask, triton)
    x = apply_bans(x, md)
    x = apply_penalties(x, md)
    if md.forced_rows is not None:  # every other token of a forced row is out
        x[md.forced_rows] = float("-inf")
        x[md.forced_rows, md.forced_ids] = 0.0
    return x


def apply_sampling_filters(x: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    """Steps 5-8 on processed logits ``x`` ([N, V] float32, in place): temperature, top-k / top-p, min-p
    (``-inf`` where filtered); ``softmax`` of the result is the distribution a random row draws from."""
    if md.temperature is not None:
        x.div_(md.temperature.unsqueeze(1))
    x = apply_top_k_top_p(x, md)
    return apply_min_p(x, md)


def gather_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, md: SamplingMetadata) -> LogprobsTensors | None:
    """The logprobs the rows of ``md`` asked for (None: none did), of the raw ``logits`` ([N, V]) at
    ``token_ids`` ([N] int64): the token's, the top ``max_num_logprobs`` and those at ``logprob_token_ids``."""
    if md.max_num_logprobs is None and md.logprob_token_ids is None:
        return None
    raw = torch.log_softmax(logits, dim=-1, dtype=torch.float32)  # [N, V]
    out = LogprobsTensors(logprobs=raw.gather(1, token_ids.unsqueeze(1)).squeeze(1))
    if md.max_num_logprobs:
        out.top_logprobs, out.top_logprobs_ids = torch.topk(raw, md.max_num_logprobs, dim=-1)
    if md.logprob_token_ids is not None:
        out.token_id_logprobs = raw.gather(1, md.logprob_token_ids)
    return out


class Sampler(nn.Module):
    """``forward(logits [B, V], metadata) -> SamplerOutput``; no host synchronization inside.

    ``fused=True`` samples rows that need no top-k / top-p / min-p filter with one Triton Gumbel-max
    pass (``minivllm.kernels.gumbel_sample``) instead of softmax + exponential race: the same
    distribution, other random draws (seeded rows stay reproducible and independent of their batch,
    with keys from ``(seed, step)``). Its kernels run on CUDA, or on the CPU in Triton's interpreter.
    """

    def __init__(self, fused: bool = False):
        super().__init__()
        self.fused = fused

    def forward(self, logits: torch.Tensor, md: SamplingMetadata) -> SamplerOutput:
        """Sample one token per row of ``logits`` ([B, V]) with the rows' parameters in ``md``."""
        if logits.dim() != 2 or logits.shape[0] != md.batch_size:
            raise ValueError(f"logits must be [{md.batch_size}, V], got {tuple(logits.shape)}")
        if md.output_counts is not None and md.output_counts.shape[1] != logits.shape[1]:
            raise ValueError("metadata vocab_size does not match the logits width")

        fused = (self.fused and not md.all_greedy
                 and md.no_top_k and md.no_top_p and md.no_min_p and md.watermark_rows is None)
        if (md.all_greedy or fused) and not modifies_logits(md):
            x = logits  # argmax, or the fused pass that reads the logits once: no copy
        else:
            x = process_logits(logits, md, self.fused)

        if md.all_greedy:
            sampled = torch.argmax(x, dim=-1)
        else:
            greedy = torch.argmax(x, dim=-1) if md.greedy_mask is not None else None
            if fused:
                from minivllm.kernels.gumbel_sample import gumbel_sample

                sampled = gumbel_sample(x, _gumbel_seeds(md, x.device), md.temperature)
            else:
                x = apply_sampling_filters(x, md)
                probs = torch.softmax(x, dim=-1)
                sampled = _exponential_race(probs, md)
                if md.watermark_rows is not None:
                    sampled[md.watermark_rows] = gumbel_watermark_sample(x[md.watermark_rows], md.watermark_keys)
            if greedy is not None:
                sampled = torch.where(md.greedy_mask, greedy, sampled)

        lp = gather_logprobs(logits, sampled, md)
        return SamplerOutput(sampled_token_ids=sampled, **(vars(lp) if lp is not None else {}))
