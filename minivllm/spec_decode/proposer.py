"""The interface between the model runner and a speculative-decoding proposer (n-gram, EAGLE, draft model).

Once per step, after sampling, the runner hands the proposer what the step computed and accepted
(``ProposerInputs``) and gets back each row's drafts for the next step (``DraftProposal``). The drafts travel to
the scheduler with the step's sampled tokens, and come back in the next step's ``ScheduledRow.token_ids`` after
the row's newest token, so that one forward of the target verifies them (vLLM V1's design).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np
import torch


@dataclass(frozen=True)
class ProposerInputs:
    """One step as a proposer sees it, after sampling. Rows are the step's rows in batch order (prefill chunks
    too: a model-based proposer fills its own KV cache from them); a row proposes only if ``max_drafts > 0``.

    Token history (what the n-gram proposer reads): row ``i``'s tokens are
    ``token_ids[slots[i], :num_tokens[i]]``, the prompt and every output token, this step's accepted ones
    included. ``token_ids`` is the runner's own array (all slots): read it, never write it.

    The step's flat tokens (what model-based proposers read): ``input_ids`` / ``positions`` / ``slot_mapping``
    hold every token the target computed this step (a row's drafts included), row ``i`` owning
    ``[cu_seqlens_q[i], cu_seqlens_q[i + 1])``; ``hidden_states`` the target's hidden states at those tokens
    (the proposer's ``hidden_state_layers``, concatenated; None when it asks for none).
    """

    seq_ids: tuple[int, ...]  # [rows]
    slots: np.ndarray  # [rows] int64: each row's slot in the runner's batch
    token_ids: np.ndarray  # [max_num_seqs, max_model_len] int32 (all slots; see above)
    num_tokens: np.ndarray  # [rows] int32: tokens each row holds after this step (a prefilling row: its prompt)
    num_accepted: np.ndarray  # [rows] int32: drafts of this step the row accepted (0 without drafts)
    next_token_ids: np.ndarray  # [rows] int64: the token each sampled row took last (-1: not sampled)
    max_drafts: np.ndarray  # [rows] int32: most drafts the row may take next step (0: propose none)
    input_ids: torch.Tensor  # [num_step_tokens] int64 on the device
    positions: torch.Tensor  # [num_step_tokens] int64 on the device
    slot_mapping: torch.Tensor  # [num_step_tokens] int64 on the device
    cu_seqlens_q: np.ndarray  # [rows + 1] int32
    block_tables: np.ndarray  # [rows, max_blocks] int32, -1 padded
    hidden_states: torch.Tensor | None = None  # [num_step_tokens, hidden * len(hidden_state_layers)]

    @property
    def num_rows(self) -> int:
        """The step's rows."""
        return len(self.seq_ids)


class DraftProposal(NamedTuple):
    """Each row's drafts for the next step: ``token_ids[i, :num_drafts[i]]``."""

    token_ids: np.ndarray  # [rows, k] int32
    num_drafts: np.ndarray  # [rows] int32, each <= the row's max_drafts
    # [rows, k, V] float32 over the target's vocabulary: the distribution each draft was drawn from; None:
    # deterministic drafts (each has probability 1 under the proposer, as n-gram's and greedy heads')
    probs: torch.Tensor | None = None


class Proposer(Protocol):
    """Drafts tokens for the target to verify. Built once per runner (rank 0) from the ``SpeculativeConfig``."""

    #: k: most drafts per row and step
    num_speculative_tokens: int
    #: target layers whose hidden states ``ProposerInputs.hidden_states`` carries (EAGLE-3: three); () for none
    hidden_state_layers: tuple[int, ...]
    #: it must see every step, even one whose rows may not draft (its own KV cache computes every token); False:
    #: it reads only the runner's token history (n-gram), so such steps are sampled without it (the runner
    #: treats a proposer without this attribute as True)
    needs_every_step: bool

    def propose(self, inputs: ProposerInputs) -> DraftProposal:
        """Each row's drafts for the next step (no row more than its ``max_drafts``)."""
        ...

    def remove(self, seq_ids: tuple[int, ...]) -> None:
        """Forget state kept for sequences that left the batch (a proposer without any ignores it)."""
        ...


def no_drafts(num_rows: int, k: int) -> DraftProposal:
    """A proposal of no drafts for ``num_rows`` rows."""
    return DraftProposal(np.zeros((num_rows, k), dtype=np.int32), np.zeros(num_rows, dtype=np.int32))
