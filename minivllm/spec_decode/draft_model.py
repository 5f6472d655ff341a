"""The draft-model proposer (``method="draft_model"``): a small causal LM of the target's tokenizer drafts
greedily, with its own paged KV cache over the target's block ids (``minivllm.spec_decode.draft_steps``).

Each step it catches up over the step's accepted tokens (their real slots), then runs one forward per draft:
the newest token (sampled this step, not yet computed by anyone), then each draft, one position further on, in
scratch blocks. Its drafts are argmaxes: deterministic, so the proposal carries no probabilities.
"""

from __future__ import annotations

import numpy as np
import torch

from minivllm.config.hf import load_arch
from minivllm.models.loader import build_context, load_weights
from minivllm.models.registry import get_model_class
from minivllm.spec_decode.draft_steps import CatchUp, DraftKVCache
from minivllm.spec_decode.proposer import DraftProposal, ProposerInputs, no_drafts


class DraftModelProposer:
    """``Proposer`` of the checkpoint at ``path`` drafting for a target of ``target_vocab_size`` tokens, built on
    ``device`` in ``dtype``; ``init_kv_cache`` gives it its cache."""

    hidden_state_layers: tuple[int, ...] = ()

    #: its KV cache must see every step's tokens (prefill chunks, steps above disable_by_batch_size)
    needs_every_step = True

    def __init__(self, path: str, num_speculative_tokens: int, target_vocab_size: int, max_model_len: int,
                 device: torch.device, dtype: torch.dtype, backend: str = "torch"):
        arch = load_arch(path)
        if arch.vocab_size != target_vocab_size:
            raise ValueError(f"the draft model at {path!r} has vocab_size {arch.vocab_size}, the target "
                             f"{target_vocab_size}: a draft model must share the target's tokenizer")
        if arch.layer_types is not None and any(t != "full_attention" for t in arch.layer_types):
            raise ValueError(f"the draft model at {path!r} has sliding-window layers, which drafting does not support")
        self.num_speculative_tokens = num_speculative_tokens
        self.max_model_len = max_model_len
        with build_context(device, dtype):
            self.model = get_model_class(arch.architecture)(arch, max_position=max_model_len, backend=backend)
        self.model.eval()
        load_weights(self.model, path)
        self.kv: DraftKVCache | None = None
        self.device = device

    def attention_layers(self) -> list[torch.nn.Module]:
        """The draft model's attention layers, whose cache ``init_kv_cache`` allocates."""
        from minivllm.layers.attention import Attention

        return [m for m in self.model.modules() if isinstance(m, Attention)]

    def init_kv_cache(self, num_blocks: int, block_size: int, max_num_seqs: int, dtype: torch.dtype) -> None:
        """Allocate the draft model's paged cache over the target's ``num_blocks`` block ids (and scratch)."""
        self.kv = DraftKVCache(self.attention_layers(), num_blocks, block_size, self.num_speculative_tokens,
                               max_num_seqs, dtype, self.device)

    def _draft(self, ids: torch.Tensor, positions: np.ndarray, meta) -> torch.Tensor:
        hidden = self.model(ids, torch.from_numpy(positions).to(self.device), meta)  # [rows, hidden]
        return self.model.compute_logits(hidden).argmax(-1)  # [rows]

    @torch.inference_mode()
    def propose(self, inputs: ProposerInputs) -> DraftProposal:
        """Catch up over the step's accepted tokens, then draft up to each row's ``max_drafts``."""
        if self.kv is None:
            raise RuntimeError("the draft model's KV cache is not allocated (init_kv_cache)")
        k = self.num_speculative_tokens
        cu = CatchUp.of(inputs)
        out = no_drafts(inputs.num_rows, k)
        if len(cu.index):
            ids = torch.from_numpy(cu.tokens(inputs, 0)).to(self.device)  # [n]
            self.model(ids, torch.from_numpy(cu.positions).to(self.device), self.kv.catch_up_meta(inputs, cu))
        want = np.flatnonzero((inputs.max_drafts > 0) & (cu.count > 0))  # [d] drafting rows
        if not len(want):
            return out
        first = cu.start[want] + cu.count[want]  # [d]: the newest token's position
        tok = torch.from_numpy(inputs.token_ids[inputs.slots[want], first].astype(np.int64)).to(self.device)
        tables = self.kv.ahead_tables(inputs.block_tables[want], first)
        steps = int(inputs.max_drafts[want].max())
        drafts = []
        for j in range(steps):
            pos = np.minimum(first + j, self.max_model_len - 1)  # [d]
            tok = self._draft(tok, pos, self.kv.draft_step_meta(tables, pos))
            drafts.append(tok)
        out.token_ids[want, :steps] = torch.stack(drafts, dim=1).cpu().numpy()
        out.num_drafts[want] = np.minimum(inputs.max_drafts[want], steps)
        return out

    def remove(self, seq_ids: tuple[int, ...]) -> None:
        """Nothing is kept per sequence (the cache follows the target's blocks)."""
