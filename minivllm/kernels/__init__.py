"""Attention and cache kernels: a plain torch reference and Triton kernels for the GPU."""
