"""The engine's sub-configs besides the model's: KV cache, scheduler, structured outputs, parallelism, device and
kernels."""

from __future__ import annotations

from dataclasses import dataclass

from minivllm.config.fields import arg, at_least, check_types


@dataclass
class CacheConfig:
    """The paged KV cache: block size, how many blocks, their dtype, prefix caching."""

    kvcache_block_size: int = arg(16, "tokens per KV cache block (a power of two from 16 to 256)")
    num_kvcache_blocks: int | None = arg(None, "KV cache blocks (default: as many as fit in free memory); with "
                                               "sliding-window layers, the memory of that many blocks of every "
                                               "layer, split between the KV cache groups")
    gpu_memory_utilization: float = arg(0.9, "fraction of the GPU's memory the engine may use, in (0, 1]")
    cpu_kvcache_space_gib: float = arg(2.0, "cap on the KV cache on the CPU, GiB")
    enable_prefix_caching: bool = arg(True, "share the KV blocks of common prompt prefixes between requests")
    kv_cache_dtype: str = arg("auto", "auto (the model's dtype) or fp8 (e4m3, values saturated at +-448, scale "
                                      "1: half the bytes of bf16, some accuracy lost)", choices=("auto", "fp8"))
    disable_hybrid_kv_cache_manager: bool = arg(
        False, "keep every block of a sequence for every layer: sliding-window layers do not release the blocks "
               "their window left, and one block pool serves all layers")

    def __post_init__(self) -> None:
        check_types(self)
        bs = self.kvcache_block_size
        if not (16 <= bs <= 256 and bs & (bs - 1) == 0):
            raise ValueError(f"kvcache_block_size must be a power of two from 16 to 256, got {bs}")
        if self.num_kvcache_blocks is not None:
            at_least("num_kvcache_blocks", self.num_kvcache_blocks, 1)
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if not self.cpu_kvcache_space_gib > 0:
            raise ValueError(f"cpu_kvcache_space_gib must be > 0, got {self.cpu_kvcache_space_gib}")


@dataclass
class SchedulerConfig:
    """The token-budget scheduler (vLLM V1's names and meanings)."""

    max_num_seqs: int = arg(256, "most sequences in one step")
    max_num_batched_tokens: int = arg(16384, "token budget of one step")
    enable_chunked_prefill: bool = arg(True, "split prompts longer than the step's budget over several steps")
    max_num_partial_prefills: int = arg(1, "prompts prefilled in chunks at the same time")
    max_long_partial_prefills: int = arg(1, "of those, prompts longer than long_prefill_threshold")
    long_prefill_threshold: int = arg(0, "per-step cap on one prompt's chunk (0: none)")
    async_scheduling: bool | None = arg(None, "launch step N+1 before step N's tokens reach the host "
                                              "(default: on with a GPU)")

    def __post_init__(self) -> None:
        check_types(self)
        at_least("max_num_seqs", self.max_num_seqs, 1)
        at_least("max_num_batched_tokens", self.max_num_batched_tokens, 1)
        at_least("max_num_partial_prefills", self.max_num_partial_prefills, 1)
        at_least("max_long_partial_prefills", self.max_long_partial_prefills, 1)
        if self.max_long_partial_prefills > self.max_num_partial_prefills:
            raise ValueError("max_long_partial_prefills must not exceed max_num_partial_prefills")
        at_least("long_prefill_threshold", self.long_prefill_threshold, 0)


@dataclass
class StructuredOutputsConfig:
    """Structured outputs (grammars, with llguidance): the compiled-grammar cache and the mask-filling threads."""

    structured_outputs_cache_size: int = arg(256, "compiled grammars kept (one per distinct schema, regex, choice "
                                                  "or grammar; the least recently used goes first)")
    structured_outputs_threads: int | None = arg(None, "host threads that fill a step's grammar masks (default: "
                                                       "the CPU count, at most 8)")

    def __post_init__(self) -> None:
        check_types(self)
        at_least("structured_outputs_cache_size", self.structured_outputs_cache_size, 1)
        if self.structured_outputs_threads is not None:
            at_least("structured_outputs_threads", self.structured_outputs_threads, 1)


@dataclass
class ParallelConfig:
    """Tensor parallelism: one process per GPU, NCCL between them (gloo on the CPU). Data parallelism: engine
    replicas on Ray, each with ``gpus_per_replica`` GPUs (``minivllm[ray]``): Ray actors for ``LLM``, a Ray Serve
    deployment for ``minivllm serve``."""

    tensor_parallel_size: int = arg(1, "GPUs to shard the model over")
    data_parallel_size: int = arg(1, "engine replicas run through Ray: LLM splits its prompts among them, serve "
                                     "routes each request to one (needs the ray extra)")
    gpus_per_replica: float | None = arg(None, "GPUs Ray gives each replica (default: tensor_parallel_size); a "
                                               "fraction below 1 lets replicas share a GPU, each then needs its "
                                               "share of gpu_memory_utilization")
    disable_custom_all_reduce: bool = arg(False, "sum every tensor-parallel activation with NCCL instead of "
                                                 "the one-shot all-reduce kernel over CUDA IPC buffers")

    def __post_init__(self) -> None:
        check_types(self)
        at_least("tensor_parallel_size", self.tensor_parallel_size, 1)
        at_least("data_parallel_size", self.data_parallel_size, 1)
        g = self.gpus_per_replica
        if g is not None and not (0 < g <= 1 if self.tensor_parallel_size == 1 else g == self.tensor_parallel_size):
            raise ValueError(f"gpus_per_replica must be in (0, 1] at tensor_parallel_size 1, else equal to "
                             f"tensor_parallel_size ({self.tensor_parallel_size}); got {g}")

    @property
    def replica_gpus(self) -> float:
        """GPUs one data-parallel replica asks Ray for (on a GPU device)."""
        return self.gpus_per_replica if self.gpus_per_replica is not None else self.tensor_parallel_size


@dataclass
class DeviceConfig:
    """Where the model runs and with which kernels.

    ``attention_backend="triton"`` runs the Triton kernels (paged attention, fused norms, RoPE, activation);
    "torch" runs the plain torch reference. The fused Gumbel sampler and, at TP > 1, sharded sampling run
    wherever Triton kernels do: on CUDA, and on the CPU with the triton backend (Triton's interpreter).
    """

    device: str = arg("cuda", "cpu, cuda or cuda:N (default: cuda when a GPU is visible)")
    attention_backend: str | None = arg(None, "torch or triton (default: triton on a GPU, torch on the CPU)",
                                        choices=("torch", "triton"))
    enforce_eager: bool = arg(False, "never capture CUDA graphs")
    cpu_threads: int | None = arg(None, "torch threads on the CPU (default: OMP_NUM_THREADS if set, else 1 for "
                                        "models under 1B parameters, else half the cores)")

    def __post_init__(self) -> None:
        check_types(self)
        if self.device not in ("cpu", "cuda") and not (self.device.startswith("cuda:")
                                                       and self.device[5:].isdigit()):
            raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")
        if self.attention_backend is None:
            self.attention_backend = "torch" if self.device == "cpu" else "triton"
        if self.cpu_threads is not None:
            at_least("cpu_threads", self.cpu_threads, 1)

    @property
    def triton_sampling(self) -> bool:
        """Whether sampling uses the Triton kernels (fused Gumbel sampler, sharded sampling)."""
        return self.device != "cpu" or self.attention_backend == "triton"
