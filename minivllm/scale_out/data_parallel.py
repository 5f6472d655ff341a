"""Data parallelism offline: ``LLM(model, data_parallel_size=N)`` runs N engine replicas as Ray actors.

``LLM`` composes a ``DataParallelEngine`` instead of one ``LLMEngine``. Each replica is a whole ``LLMEngine``
(its own scheduler, KV cache and, at ``tensor_parallel_size`` > 1, its own tensor-parallel workers) on
``gpus_per_replica`` GPUs (default ``tensor_parallel_size``; a fraction shares one); Ray places the actors and
gives each its GPUs. ``run_batch`` cuts the prompts into N contiguous shards of near-equal size, runs the shards
at once, and returns the outputs in prompt order. A replica that dies is restarted by Ray, and its shard runs
once more on another replica. Ray is the cluster manager: with no Ray runtime in the process, one is started
here (a local one) and shut down by :meth:`DataParallelEngine.close`; with one (``ray.init`` called before,
e.g. to join a cluster), the replicas run on it and it is left running.
"""

from __future__ import annotations

import weakref

from minivllm.outputs import RequestOutput
from minivllm.sampling_params import SamplingParams


def _import_ray():
    try:
        import ray
    except ImportError as e:
        raise ImportError('data_parallel_size > 1 runs its replicas on Ray: pip install -e ".[ray]" (the ray extra)') from e
    return ray


class _Replica:
    """One engine replica inside a Ray actor."""

    def __init__(self, model: str, kwargs: dict):
        from minivllm.engine.llm_engine import LLMEngine

        self.engine = LLMEngine(model, **kwargs)

    def ready(self) -> int:
        return self.engine.num_kvcache_blocks

    def run_batch(self, prompts: list, params: list[SamplingParams], lora_requests: list | None = None
                  ) -> list[RequestOutput]:
        return self.engine.run_batch(prompts, params, use_tqdm=False, lora_requests=lora_requests)

    def close(self) -> None:
        self.engine.close()


def shard_bounds(n_items: int, n_shards: int) -> list[tuple[int, int]]:
    """``[start, end)`` of ``n_shards`` contiguous shards of near-equal size (the first ones one longer)."""
    base, extra = divmod(n_items, n_shards)
    bounds, start = [], 0
    for i in range(n_shards):
        end = start + base + (1 if i < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


_MAX_RESTARTS = 3  # a replica that dies is restarted by Ray (its engine built again), this many times at most


class DataParallelEngine:
    """``data_parallel_size`` replicas of ``LLMEngine(model, **kwargs)`` behind one ``run_batch``; ``tokenizer``
    is the model's (loaded here too, for ``LLM.chat``)."""

    def __init__(self, model: str, data_parallel_size: int, **kwargs):
        from minivllm.config import Config
        from minivllm.engine.tokenizer import load_tokenizer

        config = Config.create(model, data_parallel_size=data_parallel_size, **kwargs)  # ValueError on bad input
        self.config = config
        ray = _import_ray()
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
        self.data_parallel_size = data_parallel_size
        gpus = config.parallel_config.replica_gpus if config.device_config.device != "cpu" else 0
        self._replicas = []
        self._finalizer = weakref.finalize(self, _shutdown, self._replicas, self._owns_ray)
        available = ray.cluster_resources().get("GPU", 0)
        if gpus and available < gpus * data_parallel_size:  # Ray would wait for them forever
            self.close()
            raise ValueError(f"data_parallel_size {data_parallel_size} x {gpus:g} GPUs a replica needs "
                             f"{gpus * data_parallel_size:g} GPUs; the Ray cluster has {available:g}")
        # NOTE: no CPU reservation: a replica's threads are the engine's own (cpu_threads), and a reserved CPU
        # per actor would leave replicas pending forever on a machine with fewer cores than replicas
        actor = ray.remote(num_cpus=0, num_gpus=gpus, max_restarts=_MAX_RESTARTS)(_Replica)
        self._replicas.extend(actor.remote(model, kwargs) for _ in range(data_parallel_size))
        try:
            blocks = self._get([r.ready.remote() for r in self._replicas])
        except BaseException:
            self.close()
            raise
        self.num_kvcache_blocks = blocks[0]
        self.tokenizer = None if config.model_config.skip_tokenizer_init else load_tokenizer(model)

    def _get(self, refs):
        ray = _import_ray()
        try:
            return ray.get(refs)
        except ray.exceptions.RayTaskError as e:  # the replica's own exception (a ValueError naming the field)
            raise e.as_instanceof_cause() from None

    def run_batch(self, prompts: list, params: list[SamplingParams], use_tqdm: bool = False,
                  lora_requests: list | None = None) -> list[RequestOutput]:
        """``LLMEngine.run_batch`` over the replicas: the same outputs, in prompt order (``use_tqdm`` is ignored)."""
        if len(prompts) != len(params):
            raise ValueError(f"got {len(params)} sampling params for {len(prompts)} prompts")
        if lora_requests is not None and len(lora_requests) != len(prompts):
            raise ValueError(f"lora_request: got {len(lora_requests)} for {len(prompts)} prompts")
        shards = [(lo, hi) for lo, hi in shard_bounds(len(prompts), len(self._replicas)) if hi > lo]
        call = lambda i, lo, hi: self._replicas[i].run_batch.remote(
            prompts[lo:hi], params[lo:hi], lora_requests[lo:hi] if lora_requests is not None else None)
        refs = [call(i, lo, hi) for i, (lo, hi) in enumerate(shards)]
        outs = []
        for i, ((lo, hi), ref) in enumerate(zip(shards, refs)):
            try:
                outs.extend(self._get(ref))
            except _import_ray().exceptions.RayActorError:
                # the replica died (Ray restarts it): its shard runs once more on the next replica, since
                # nothing of it was returned; a second death is an error
                try:
                    outs.extend(self._get(call((i + 1) % len(self._replicas), lo, hi)))
                except _import_ray().exceptions.RayActorError as e:
                    raise RuntimeError(f"prompts {lo}-{hi - 1}: their replica died, and so did the one that "
                                       f"retried them") from e
        return outs

    def close(self) -> None:
        """Stop the replicas (and the Ray runtime this object started)."""
        self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _shutdown(replicas: list, owns_ray: bool) -> None:
    import ray

    if not ray.is_initialized():
        return
    for r in replicas:
        try:
            ray.get(r.close.remote(), timeout=60)
        except Exception:  # a replica that died or hangs is killed below all the same
            pass
        ray.kill(r)
    replicas.clear()
    if owns_ray:
        ray.shutdown()
