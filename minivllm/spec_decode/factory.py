"""The proposer of a ``SpeculativeConfig``'s method."""

from __future__ import annotations

from minivllm.config.speculative import SpeculativeConfig
from minivllm.spec_decode.proposer import Proposer


def build_proposer(spec: SpeculativeConfig) -> Proposer:
    """The proposer that ``spec.method`` names; ValueError for a method this build cannot run yet."""
    if spec.method == "ngram":
        from minivllm.spec_decode.ngram_drafter import NgramDrafter

        return NgramDrafter(spec.num_speculative_tokens, spec.prompt_lookup_min, spec.prompt_lookup_max)
    raise ValueError(f"speculative_config.method {spec.method!r} has no proposer in this engine yet (ngram has)")
