"""Scale-out on Ray: whole engines side by side, each on its own GPUs (``pip install 'minivllm[ray]'``).

- ``data_parallel.py``: ``LLM(model, data_parallel_size=N)``, N engine replicas as Ray actors for offline batches;
- ``ray_data.py``: one engine per actor of a Ray Dataset's ``map_batches``;
- ``serve/``: ``minivllm serve MODEL --data-parallel-size N``, engine replicas behind one OpenAI endpoint on Ray
  Serve.

Importing this package imports no Ray: its modules import Ray where they use it.
"""
