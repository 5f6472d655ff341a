"""Tensor parallelism: the group layers are given, the NCCL communicator, the one-shot custom all-reduce."""
