"""Sampling: the batched sampler and its per-step metadata, logits processors (penalties, top-k/p, min-p, bans,
token edits), tensor-parallel sampling of vocabulary slices, and prompt logprobs."""
