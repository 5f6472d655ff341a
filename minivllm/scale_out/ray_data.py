"""Offline batch inference over a Ray Dataset: one minivllm engine per replica of a ``map_batches`` actor pool.

``LLMPredictor`` is the callable class ``map_batches`` builds once per actor (one engine each, on the
actor's ``tensor_parallel_size`` GPUs); ``generate_dataset`` wires it up with vLLM's Ray Data recipe:
``concurrency`` = the number of replicas, ``num_gpus`` = each replica's tensor-parallel size. Output rows
keep the input's columns and order, and add ``generated_text``, ``generated_token_ids`` and
``finish_reason``.
"""

from __future__ import annotations

import numpy as np

from minivllm.sampling_params import SamplingParams


class LLMPredictor:
    """For ``Dataset.map_batches``: generates for the ``prompt_column`` of each batch (strings or token-id
    lists) with one ``SamplingParams``, and returns the batch with the outputs added."""

    def __init__(self, model: str, sampling_params: SamplingParams | None = None, prompt_column: str = "prompt",
                 **engine_kwargs):
        from minivllm.llm import LLM

        self.llm = LLM(model, **engine_kwargs)
        self.params = sampling_params or SamplingParams()
        self.prompt_column = prompt_column

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.prompt_column not in batch:
            raise ValueError(f"prompt_column {self.prompt_column!r} is not a column of the dataset "
                             f"(columns: {', '.join(batch)})")
        prompts = [p if isinstance(p, str) else [int(t) for t in p] for p in batch[self.prompt_column]]
        outs = self.llm.generate(prompts, self.params, use_tqdm=False)
        token_ids = np.empty(len(outs), dtype=object)  # [rows] of lists: ragged
        token_ids[:] = [o["token_ids"] for o in outs]
        return {**batch, "generated_text": np.array([o["text"] for o in outs], dtype=object),
                "generated_token_ids": token_ids,
                "finish_reason": np.array([o["finish_reason"] for o in outs], dtype=object)}


def generate_dataset(ds, model: str, sampling_params: SamplingParams | None = None, *,
                     data_parallel_size: int = 1, tensor_parallel_size: int = 1, batch_size: int = 64,
                     prompt_column: str = "prompt", **engine_kwargs):
    """``ds`` (a ``ray.data.Dataset``) with each row's generation added, by ``data_parallel_size`` engine
    replicas of ``tensor_parallel_size`` GPUs each (none on the CPU). Lazy, as Ray Data is: ``take_all``,
    ``write_parquet`` and the like run it.

    The returned dataset's own ``DataContext`` preserves order, so that the rows come out in the input's
    order whatever replica ran them.
    """
    if data_parallel_size < 1 or tensor_parallel_size < 1:
        raise ValueError(f"data_parallel_size and tensor_parallel_size must be >= 1, got {data_parallel_size} "
                         f"and {tensor_parallel_size}")
    gpus = 0 if engine_kwargs.get("device") == "cpu" else tensor_parallel_size
    out = ds.map_batches(
        LLMPredictor, batch_size=batch_size, concurrency=data_parallel_size, num_gpus=gpus,
        num_cpus=0 if gpus == 0 else None,  # the engines' threads are their own; see DataParallelEngine
        fn_constructor_kwargs=dict(model=model, sampling_params=sampling_params, prompt_column=prompt_column,
                                   tensor_parallel_size=tensor_parallel_size, **engine_kwargs))
    out.context.execution_options.preserve_order = True
    return out
