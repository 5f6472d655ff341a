"""The token statistics that penalties read, kept on the device for the sequences that have penalties.

Repetition, presence and frequency penalties read which tokens a sequence's prompt holds and how often each
token was generated. Sending those tokens from the host every step costs time that grows with the context,
and waits for each step's token values. Instead each penalized sequence owns one row of two device tensors,
filled once when the runner first sees it (``add``), and each step's sampled tokens are counted into their
rows on the device right after sampling (``record``), in stream order: the next step's penalties see them
without the host ever reading them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class PenaltyState:
    """Per-sequence ``output_counts`` ([V] float32: times each token was generated) and ``prompt_mask`` ([V]
    bool: the token occurs in the prompt) on ``device``, for the sequences that have penalties.

    Row 0 stays zero: ``gather`` gives it to rows without penalties (their penalty values leave the logits
    unchanged whatever it holds). The tensors grow by doubling as more sequences need rows.
    """

    def __init__(self, vocab_size: int, device: torch.device):
        self.vocab_size, self.device = vocab_size, device
        self.counts: torch.Tensor | None = None  # [capacity, V] float32
        self.prompt_mask: torch.Tensor | None = None  # [capacity, V] bool
        self.rows: dict[int, int] = {}  # seq id -> its row
        self._free: list[int] = []

    def _grow(self) -> None:
        old = 0 if self.counts is None else self.counts.shape[0]
        cap = max(8, 2 * old)
        counts = torch.zeros(cap, self.vocab_size, dtype=torch.float32, device=self.device)
        mask = torch.zeros(cap, self.vocab_size, dtype=torch.bool, device=self.device)
        if old:
            counts[:old] = self.counts
            mask[:old] = self.prompt_mask
        self.counts, self.prompt_mask = counts, mask
        self._free.extend(range(cap - 1, max(old, 1) - 1, -1))  # row 0 is never handed out

    def add(self, seq_id: int, prompt_token_ids: Sequence[int] | None, output_token_ids: Sequence[int]) -> None:
        """Give ``seq_id`` a row holding its prompt (None: no repetition penalty reads it) and the tokens it
        generated so far (a sequence back from a preemption)."""
        if seq_id in self.rows:
            raise RuntimeError(f"sequence {seq_id} already has penalty statistics")
        if not self._free:
            self._grow()
        row = self.rows[seq_id] = self._free.pop()
        self.counts[row].zero_()
        self.prompt_mask[row].zero_()
        if output_token_ids:
            ids = torch.tensor(list(output_token_ids), dtype=torch.int64).to(self.device)  # [n]
            self.counts[row].index_add_(0, ids, torch.ones(len(ids), dtype=torch.float32, device=self.device))
        if prompt_token_ids:
            self.prompt_mask[row, torch.tensor(list(prompt_token_ids), dtype=torch.int64).to(self.device)] = True

    def remove(self, seq_id: int) -> None:
        """Free ``seq_id``'s row (unknown ids are ignored)."""
        row = self.rows.pop(seq_id, None)
        if row is not None:
            self._free.append(row)

    def gather(self, seq_ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(output_counts [B, V], prompt_mask [B, V])`` of a step's sampled rows, zero for rows without
        penalties."""
        if self.counts is None:
            self._grow()
        index = torch.tensor([self.rows.get(s, 0) for s in seq_ids], dtype=torch.int64)
        index = index.pin_memory().to(self.device, non_blocking=True) if self.device.type == "cuda" else index
        return self.counts.index_select(0, index), self.prompt_mask.index_select(0, index)

    def record(self, seq_ids: Sequence[int], sampled: torch.Tensor, num_drafts: Sequence[int] | None = None,
               emitted: torch.Tensor | None = None) -> None:
        """Count each sampled row's new tokens into its sequence's row, on the device: ``sampled`` is [B] int64
        (row ``i`` of ``seq_ids``), or with ``num_drafts`` (a speculative step: row ``i`` owns ``num_drafts[i] + 1``
        positions) the rejection sampler's [P] tokens, of which those ``emitted`` ([P] bool) count."""
        per_row = [1] * len(seq_ids) if num_drafts is None else [n + 1 for n in num_drafts]
        pairs, first = [], 0
        for s, n in zip(seq_ids, per_row, strict=True):
            if s in self.rows:
                pairs.extend((first + j, self.rows[s]) for j in range(n))
            first += n
        if not pairs:
            return
        which, rows = zip(*pairs)
        which_t = torch.tensor(which, dtype=torch.int64)
        rows_t = torch.tensor(rows, dtype=torch.int64)
        if self.device.type == "cuda":
            which_t = which_t.pin_memory().to(self.device, non_blocking=True)
            rows_t = rows_t.pin_memory().to(self.device, non_blocking=True)
        ones = (torch.ones(len(rows), dtype=torch.float32, device=self.device) if emitted is None
                else emitted.index_select(0, which_t).to(torch.float32))  # [n]: 0 at positions not emitted
        self.counts.index_put_((rows_t, sampled.index_select(0, which_t)), ones, accumulate=True)

    def check_integrity(self) -> None:
        """Rows are handed out at most once, never row 0, and free rows are not held."""
        held = list(self.rows.values())
        assert len(set(held)) == len(held), "a penalty row is held twice"
        assert 0 not in held and 0 not in self._free, "row 0 must stay the zero row"
        assert not set(held) & set(self._free), "a held penalty row is also free"
