"""The proposer of a ``SpeculativeConfig``'s method."""

from __future__ import annotations

import os

from minivllm.config.speculative import SpeculativeConfig
from minivllm.spec_decode.proposer import Proposer


def build_proposer(spec: SpeculativeConfig, runner=None) -> Proposer:
    """The proposer that ``spec.method`` names. A model-based one (``eagle3``, ``draft_model``) is built beside
    ``runner``'s target model (its device, dtype, attention backend and ``max_model_len``)."""
    if spec.method == "ngram":
        from minivllm.spec_decode.ngram_drafter import NgramDrafter

        return NgramDrafter(spec.num_speculative_tokens, spec.prompt_lookup_min, spec.prompt_lookup_max)
    if runner is None:
        raise ValueError(f"speculative_config.method {spec.method!r} needs the model runner to build its proposer")
    if spec.draft_tensor_parallel_size not in (None, 1):
        raise ValueError("speculative_config.draft_tensor_parallel_size must be 1: drafts run on rank 0 alone")
    if not os.path.isfile(os.path.join(spec.model, "config.json")):
        raise ValueError(f"speculative_config.model {spec.model!r}: no config.json there (a local checkpoint folder "
                         "is needed)")
    mc, backend = runner.config.model_config, runner.config.device_config.attention_backend
    common = dict(max_model_len=mc.max_model_len, device=runner.device, dtype=runner.dtype, backend=backend)
    if spec.method == "draft_model":
        from minivllm.spec_decode.draft_model import DraftModelProposer

        return DraftModelProposer(spec.model, spec.num_speculative_tokens, mc.arch.vocab_size, **common)
    if spec.method == "eagle":
        raise ValueError("speculative_config.method 'eagle' (EAGLE-1 heads) is not supported: use an EAGLE-3 head "
                         "with method 'eagle3'")
    if runner.tp_group is not None:
        raise ValueError("speculative_config.method 'eagle3' needs tensor_parallel_size 1 (the target's hidden states "
                         "are read on one rank)")
    from minivllm.spec_decode.eagle import EagleProposer

    return EagleProposer(spec.model, spec.num_speculative_tokens, runner.model, **common)
