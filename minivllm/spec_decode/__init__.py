"""Speculative decoding: the proposers that draft tokens and the interface the model runner calls them through."""
