"""The model side of a step: model runner, input batch, CUDA graphs, KV-cache sizing, executors, TP workers."""
