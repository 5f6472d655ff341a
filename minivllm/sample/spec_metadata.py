"""The sampling metadata of a step whose rows carry draft tokens: one metadata row per position to verify.

A row with ``d`` drafts is verified at ``d + 1`` positions: after its last accepted token (``j = 0``) and after
each draft (``j = 1 .. d``). Position ``j`` is sampled as the plain sampler would sample that row's next token
had the first ``j`` drafts already been generated: same parameters, ``num_generated + j`` tokens so far (the
seeded generator's step, ``min_tokens``), the drafts before it among the output tokens (penalties, bad words).
So the metadata is ``build_sampling_metadata`` of the rows repeated once per position with their outputs
extended by those drafts, and the rejection sampler (``minivllm.sample.rejection_sampler``) processes every
position's logits with the plain sampler's steps.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from minivllm.sample.metadata import SamplingMetadata, _to_device, build_sampling_metadata
from minivllm.sampling_params import SamplingParams


def position_rows(num_drafts: Sequence[int]) -> np.ndarray:
    """[P] int64: the row of each position (row ``r`` owns ``num_drafts[r] + 1`` consecutive positions)."""
    return np.repeat(np.arange(len(num_drafts), dtype=np.int64), np.asarray(num_drafts, dtype=np.int64) + 1)


def expand_penalty_tensors(penalty_tensors: tuple[torch.Tensor, torch.Tensor | None],
                           draft_token_ids: Sequence[Sequence[int]],
                           device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rows' ``(output_counts [R, V], prompt_mask [R, V] or None)`` as positions' ``[P, V]``: a position's
    counts are its row's plus the row's drafts before it (counted on the device)."""
    counts, prompt_mask = penalty_tensors
    lengths = [len(d) for d in draft_token_ids]
    rows = _to_device(position_rows(lengths), torch.int64, device)  # [P]
    out = counts.index_select(0, rows)  # [P, V]
    if sum(lengths):
        starts = np.cumsum([0] + [n + 1 for n in lengths[:-1]])  # [R]: each row's first position
        # the draft at offset i of row r counts from position starts[r] + i + 1 on, through the row's last
        after = np.concatenate([s + 1 + np.arange(n) for s, n in zip(starts, lengths)])  # [D]
        ids = [t for d in draft_token_ids for t in d]  # [D]
        step = torch.zeros_like(out)  # [P, V]: +1 where a draft starts to count
        step.index_put_((_to_device(after, torch.int64, device), _to_device(ids, torch.int64, device)),
                        torch.ones(len(ids), dtype=out.dtype, device=device), accumulate=True)
        running = step.cumsum_(0)  # [P, V]: drafts counted over all rows up to each position
        first = _to_device(np.repeat(starts, np.asarray(lengths) + 1), torch.int64, device)  # [P]
        out += running - running.index_select(0, first)  # NOTE: step is 0 at every row's first position
    return out, None if prompt_mask is None else prompt_mask.index_select(0, rows)


def build_spec_sampling_metadata(
    params: Sequence[SamplingParams],
    prompt_token_ids: Sequence[Sequence[int]],
    output_token_ids: Sequence[Sequence[int]],
    draft_token_ids: Sequence[Sequence[int]],
    eos_token_ids: Sequence[int] | Sequence[Sequence[int]] | None,
    device: torch.device | str,
    vocab_size: int,
    generator: torch.Generator | None = None,
    grammar: tuple[Sequence[int], torch.Tensor] | None = None,
    *,
    bad_words: Sequence[Sequence[Sequence[int]]] | None = None,
    num_generated: Sequence[int] | None = None,
    penalty_tensors: tuple[torch.Tensor, torch.Tensor | None] | None = None,
    forced_tokens: Sequence[int | None] | None = None,
) -> SamplingMetadata:
    """The metadata of ``sum(len(d) + 1 for d in draft_token_ids)`` positions (``batch_size``), row ``r``'s
    positions consecutive, for ``rejection_sample``.

    The arguments are ``build_sampling_metadata``'s for the rows, plus ``draft_token_ids[r]``, row ``r``'s drafts
    (host ids, empty: a row verified at one position, sampled as the plain sampler would). Exceptions:
    ``grammar`` is ``(positions, bitmask)``: the positions under a grammar (indices into the ``P`` positions) and
    their packed masks, position ``j`` of a row masked with its grammar's state after the row's first ``j``
    drafts; ``penalty_tensors`` holds the ROWS' tensors (the drafts are added here); a forced token applies at a
    row's first position only. The watermark has no rejection sampling and is not taken.
    """
    device = torch.device(device)
    batch = len(params)
    if len(draft_token_ids) != batch:
        raise ValueError(f"draft_token_ids must have one entry per row ({batch}), got {len(draft_token_ids)}")
    if num_generated is None:
        num_generated = [len(out) for out in output_token_ids]
    if len(output_token_ids) != batch or len(num_generated) != batch:
        raise ValueError("params, output_token_ids and num_generated must have the same length")
    rows = position_rows([len(d) for d in draft_token_ids]).tolist()  # [P]
    offsets = [j for d in draft_token_ids for j in range(len(d) + 1)]  # [P]
    # a position's output so far: the row's, then its drafts before the position (j = 0: the row's own list)
    outputs = [output_token_ids[r] if j == 0 else [*output_token_ids[r], *draft_token_ids[r][:j]]
               for r, j in zip(rows, offsets)]
    per_row_eos = eos_token_ids is not None and len(eos_token_ids) > 0 and not isinstance(eos_token_ids[0], int)
    if per_row_eos and len(eos_token_ids) != batch:
        raise ValueError("per-row eos_token_ids must have one entry per row")
    if penalty_tensors is not None:
        penalty_tensors = expand_penalty_tensors(penalty_tensors, draft_token_ids, device)
    return build_sampling_metadata(
        [params[r] for r in rows], [prompt_token_ids[r] for r in rows], outputs,
        [eos_token_ids[r] for r in rows] if per_row_eos else eos_token_ids, device, vocab_size, generator, grammar,
        bad_words=None if bad_words is None else [bad_words[r] for r in rows],
        num_generated=[num_generated[r] + j for r, j in zip(rows, offsets)],
        penalty_tensors=penalty_tensors,
        forced_tokens=None if forced_tokens is None else [
            forced_tokens[r] if j == 0 else None for r, j in zip(rows, offsets)],
    )
