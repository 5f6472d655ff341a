"""Speculative decoding: the proposers that draft tokens (n-gram prompt lookup, EAGLE heads, draft models)."""
