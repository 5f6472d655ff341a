"""The EAGLE-3 proposer (``method="eagle3"``): a draft head (``minivllm.models.eagle3``) over the target's hidden
states at three layers, drafting greedily.

Each step the head catches up over the step's accepted tokens: at position ``p`` it reads the token at ``p + 1``
and ``fc`` of the target's fused states at ``p`` (so its KV cache at ``p`` is that pair's); the output at a row's
last accepted position drafts the first token. Each further draft feeds the head its previous draft and its own
pre-norm output, one position further on (in scratch blocks, see ``minivllm.spec_decode.draft_steps``). Drafts
are the head's argmax mapped through ``d2t``: deterministic, so the proposal carries no probabilities (the
verifier keeps the target's distribution exactly, as for n-gram).
"""

from __future__ import annotations

import inspect

import numpy as np
import torch

from minivllm.models.eagle3 import Eagle3LlamaForCausalLM
from minivllm.models.eagle3_loader import load_eagle3_config, load_eagle3_weights
from minivllm.models.loader import build_context
from minivllm.spec_decode.draft_steps import CatchUp, DraftKVCache
from minivllm.spec_decode.proposer import DraftProposal, ProposerInputs, no_drafts


class EagleProposer:
    """``Proposer`` of an EAGLE-3 head at ``path`` for ``target`` (a decoder whose ``forward`` takes
    ``aux_layers``), built on ``device`` in ``dtype``; ``init_kv_cache`` gives it its cache."""

    #: its KV cache must see every step's tokens (prefill chunks, steps above disable_by_batch_size)
    needs_every_step = True

    def __init__(self, path: str, num_speculative_tokens: int, target: torch.nn.Module, max_model_len: int,
                 device: torch.device, dtype: torch.dtype, backend: str = "torch"):
        if "aux_layers" not in inspect.signature(target.forward).parameters:
            raise ValueError(f"speculative_config.method 'eagle3' needs a target that returns the hidden states of "
                             f"chosen layers; {type(target).__name__} does not")
        cfg = load_eagle3_config(path)
        arch = target.model.embed_tokens.num_embeddings, target.model.embed_tokens.weight.shape[1]
        if cfg.arch.vocab_size != arch[0] or cfg.target_hidden_size != arch[1]:
            raise ValueError(f"the EAGLE-3 head at {path!r} is for a target of vocab_size {cfg.arch.vocab_size} and "
                             f"hidden_size {cfg.target_hidden_size}; this target has {arch[0]} and {arch[1]}")
        self.num_speculative_tokens = num_speculative_tokens
        self.hidden_state_layers = cfg.aux_layers_for(len(target.model.layers))
        self.max_model_len = max_model_len
        with build_context(device, dtype):
            self.head = Eagle3LlamaForCausalLM(cfg, max_position=max_model_len, backend=backend)
        self.head.eval()
        if not load_eagle3_weights(self.head, path):
            if cfg.arch.hidden_size != arch[1]:
                raise ValueError(f"the EAGLE-3 head at {path!r} has no embedding of its own and a hidden size "
                                 f"({cfg.arch.hidden_size}) other than its target's ({arch[1]})")
            self.head.embed_tokens = target.model.embed_tokens  # shared, as published heads expect
        self.kv: DraftKVCache | None = None
        self.device = device

    def attention_layers(self) -> list[torch.nn.Module]:
        """The head's attention layers (one), whose cache ``init_kv_cache`` allocates."""
        return [self.head.midlayer.self_attn.attn]

    def init_kv_cache(self, num_blocks: int, block_size: int, max_num_seqs: int, dtype: torch.dtype) -> None:
        """Allocate the head's paged cache over the target's ``num_blocks`` block ids (and scratch blocks)."""
        self.kv = DraftKVCache(self.attention_layers(), num_blocks, block_size, self.num_speculative_tokens,
                               max_num_seqs, dtype, self.device)

    @torch.inference_mode()
    def propose(self, inputs: ProposerInputs) -> DraftProposal:
        """Catch up over the step's accepted tokens, then draft up to each row's ``max_drafts``."""
        if inputs.hidden_states is None or self.kv is None:
            raise RuntimeError("the EAGLE-3 proposer needs the target's hidden states and its KV cache")
        k = self.num_speculative_tokens
        cu = CatchUp.of(inputs)
        if not len(cu.index):
            return no_drafts(inputs.num_rows, k)
        meta = self.kv.catch_up_meta(inputs, cu)
        dev = self.device
        index = torch.from_numpy(cu.index).to(inputs.hidden_states.device)
        hidden = self.head.combine_hidden_states(inputs.hidden_states[index])  # [n, hidden]
        ids = torch.from_numpy(cu.tokens(inputs, 1)).to(dev)  # [n]: each position's next token
        normed, prenorm = self.head(ids, torch.from_numpy(cu.positions).to(dev), hidden, meta)
        want = np.flatnonzero((inputs.max_drafts > 0) & (cu.count > 0))  # [d] drafting rows
        out = no_drafts(inputs.num_rows, k)
        if not len(want):
            return out
        last = torch.from_numpy(cu.last()[want]).to(dev)
        h = prenorm[last]  # [d, hidden]
        tok = self.head.draft_to_target(self.head.compute_logits(normed[last]).argmax(-1))  # [d]
        drafts = [tok]
        first = cu.start[want] + cu.count[want]  # [d]: the first position past the accepted tokens
        steps = int(inputs.max_drafts[want].max())
        if steps > 1:
            tables = self.kv.ahead_tables(inputs.block_tables[want], first)
            for j in range(steps - 1):
                pos = np.minimum(first + j, self.max_model_len - 1)  # [d]
                normed, h = self.head(tok, torch.from_numpy(pos).to(dev), h, self.kv.draft_step_meta(tables, pos))
                tok = self.head.draft_to_target(self.head.compute_logits(normed).argmax(-1))
                drafts.append(tok)
        out.token_ids[want, :steps] = torch.stack(drafts, dim=1).cpu().numpy()
        out.num_drafts[want] = np.minimum(inputs.max_drafts[want], steps)
        return out

    def remove(self, seq_ids: tuple[int, ...]) -> None:
        """Nothing is kept per sequence (the cache follows the target's blocks)."""
