"""The n-gram proposer behind the runner's ``Proposer`` interface: prompt lookup over each row's token history."""

from __future__ import annotations

import numpy as np

from minivllm.spec_decode.ngram import NgramProposer
from minivllm.spec_decode.proposer import DraftProposal, ProposerInputs


class NgramDrafter:
    """``Proposer`` of ``method="ngram"``: ``NgramProposer`` on the rows that may draft, from the runner's token
    history (``ProposerInputs.token_ids``). Deterministic: no draft probabilities."""

    hidden_state_layers: tuple[int, ...] = ()
    needs_every_step = False  # its state is the runner's token history

    def __init__(self, num_speculative_tokens: int, prompt_lookup_min: int, prompt_lookup_max: int):
        self.num_speculative_tokens = num_speculative_tokens
        self.lookup = NgramProposer(num_speculative_tokens, prompt_lookup_min, prompt_lookup_max)

    def propose(self, inputs: ProposerInputs) -> DraftProposal:
        """Each row's prompt-lookup drafts, at most its ``max_drafts``."""
        k = self.num_speculative_tokens
        drafts = np.zeros((inputs.num_rows, k), dtype=np.int32)  # [rows, k]
        num_drafts = np.zeros(inputs.num_rows, dtype=np.int32)  # [rows]
        want = np.flatnonzero(inputs.max_drafts > 0)  # [n]
        if len(want):
            lengths = inputs.num_tokens[want]  # [n]
            history = inputs.token_ids[inputs.slots[want], :int(lengths.max())]  # [n, longest]
            found, count = self.lookup.propose(history, lengths)
            drafts[want] = found
            num_drafts[want] = np.minimum(count, inputs.max_drafts[want])
        return DraftProposal(drafts, num_drafts)

    def remove(self, seq_ids: tuple[int, ...]) -> None:
        """Nothing is kept per sequence."""
