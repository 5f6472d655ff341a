"""Engine configuration: one validated dataclass, plus the model facts it needs.

No file I/O happens here: ``minivllm.utils.hf_config.load_model_config`` reads a checkpoint's
``config.json`` into a ``ModelConfig``, so tests can build configs for made-up shapes.
"""

from __future__ import annotations

import numbers
import os
from dataclasses import dataclass, field, fields

_DTYPES = ("float32", "float16", "bfloat16")


@dataclass
class ModelConfig:
    """Architecture facts of a checkpoint, normalised across transformers 4.x / 5.x layouts."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int = 4096
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    dtype: str = "bfloat16"
    eos_token_ids: list[int] = field(default_factory=list)
    bos_token_id: int | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"model config: {name} must be >= 1, got {getattr(self, name)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"model config: num_attention_heads ({self.num_attention_heads}) must be a multiple "
                f"of num_key_value_heads ({self.num_key_value_heads})")
        if self.dtype not in _DTYPES:
            raise ValueError(f"model config: dtype must be one of {_DTYPES}, got {self.dtype!r}")


@dataclass
class Config:
    """Everything the engine needs; built by ``Config.create`` from a checkpoint and kwargs.

    ``num_kvcache_blocks=None`` means "size the cache from free memory" (the model runner
    decides and writes the result back before the scheduler is built).
    """

    model: str
    model_config: ModelConfig
    device: str = "cuda"
    dtype: str | None = None  # None: the checkpoint's
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 16384
    max_model_len: int | None = None  # None: min(4096, max_position_embeddings)
    kvcache_block_size: int = 16
    num_kvcache_blocks: int | None = None
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    enforce_eager: bool = False
    tensor_parallel_size: int = 1
    seed: int = 0
    # Token-budget scheduler (vLLM V1 names and meanings).
    enable_chunked_prefill: bool = True
    max_num_partial_prefills: int = 1
    max_long_partial_prefills: int = 1
    long_prefill_threshold: int = 0  # 0: no per-step cap on one prompt's chunk
    load_format: str = "auto"  # "auto" (safetensors) or "dummy" (random weights)
    attention_backend: str | None = None  # None: "triton" on cuda, "torch" on cpu
    cpu_kvcache_space_gib: float = 2.0  # cap on the CPU KV cache when sizing from memory
    # Schedule and launch step N+1 before step N's tokens reach the host (None: on GPUs only).
    async_scheduling: bool | None = None
    # "auto": the model's dtype; "fp8": e4m3 (half the bytes of bf16, values saturated at +-448)
    kv_cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        _check_types(self)
        mc = self.model_config
        if self.device not in ("cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {self.device!r}")
        if self.dtype is None:
            self.dtype = mc.dtype
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {_DTYPES}, got {self.dtype!r}")
        if self.kv_cache_dtype not in ("auto", "fp8"):
            raise ValueError(f"kv_cache_dtype must be 'auto' or 'fp8', got {self.kv_cache_dtype!r}")
        bs = self.kvcache_block_size
        if not (16 <= bs <= 256 and bs & (bs - 1) == 0):
            raise ValueError(f"kvcache_block_size must be a power of two from 16 to 256, got {bs}")
        if self.max_model_len is None:
            self.max_model_len = min(4096, mc.max_position_embeddings)
        if self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {self.max_model_len}")
        if self.max_model_len > mc.max_position_embeddings:
            raise ValueError(
                f"max_model_len ({self.max_model_len}) exceeds the model's max_position_embeddings "
                f"({mc.max_position_embeddings})")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"without chunked prefill, max_num_batched_tokens ({self.max_num_batched_tokens}) must be "
                f">= max_model_len ({self.max_model_len})")
        if self.num_kvcache_blocks is not None and self.num_kvcache_blocks < 1:
            raise ValueError(f"num_kvcache_blocks must be >= 1, got {self.num_kvcache_blocks}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if mc.num_attention_heads % self.tensor_parallel_size:
            raise ValueError(
                f"num_attention_heads ({mc.num_attention_heads}) must be divisible by "
                f"tensor_parallel_size ({self.tensor_parallel_size})")
        if self.max_num_partial_prefills < 1 or self.max_long_partial_prefills < 1:
            raise ValueError("max_num_partial_prefills and max_long_partial_prefills must be >= 1")
        if self.max_long_partial_prefills > self.max_num_partial_prefills:
            raise ValueError("max_long_partial_prefills must not exceed max_num_partial_prefills")
        if self.long_prefill_threshold < 0:
            raise ValueError(f"long_prefill_threshold must be >= 0, got {self.long_prefill_threshold}")
        if self.load_format not in ("auto", "safetensors", "dummy"):
            raise ValueError(f"load_format must be 'auto', 'safetensors' or 'dummy', got {self.load_format!r}")
        if self.async_scheduling is None:
            self.async_scheduling = self.device != "cpu"
        if self.attention_backend is None:
            self.attention_backend = "torch" if self.device == "cpu" else "triton"
        if self.attention_backend not in ("torch", "triton"):
            raise ValueError(f"attention_backend must be 'torch' or 'triton', got {self.attention_backend!r}")
        if self.attention_backend == "triton" and self.device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError("attention_backend='triton' on the CPU needs TRITON_INTERPRET=1 (Triton's interpreter, "
                             "slow: for checking kernels); use attention_backend='torch'")

    @classmethod
    def engine_arg_names(cls) -> set[str]:
        return {f.name for f in fields(cls)} - {"model", "model_config"}

    @classmethod
    def create(cls, model: str, **kwargs) -> Config:
        """Read the checkpoint's config and build a validated Config; unknown kwargs raise TypeError."""
        unknown = sorted(set(kwargs) - cls.engine_arg_names())
        if unknown:
            raise TypeError(f"unknown engine argument(s): {', '.join(unknown)}")
        from minivllm.utils.hf_config import load_model_config

        if kwargs.get("device") is None:
            kwargs["device"] = _default_device()
        model = os.fspath(model)  # NOTE: a pathlib.Path is fine
        config = cls(model=model, model_config=load_model_config(model), **kwargs)
        _check_gpus(config.device, config.tensor_parallel_size)
        return config


# NOTE: the annotations are strings (``from __future__ import annotations``); a field whose type is not
# listed here (model_config, rope_scaling, ...) is not checked
_SCALARS = {"int": numbers.Integral, "float": numbers.Real, "bool": bool, "str": str}


def _check_types(config: Config) -> None:
    """A clear error for an engine argument of the wrong type (``tensor_parallel_size="2"``), before any
    comparison raises a confusing one. bool is not accepted as a number."""
    for f in fields(config):
        name, _, optional = str(f.type).partition(" | ")
        if name not in _SCALARS or optional not in ("", "None"):
            continue
        value = getattr(config, f.name)
        if value is None and optional:
            continue
        ok = isinstance(value, _SCALARS[name]) and (name == "bool" or not isinstance(value, bool))
        if not ok:
            want = f"{'an' if name == 'int' else 'a'} {name}" + (" or None" if optional else "")
            raise ValueError(f"{f.name} must be {want}, got {value!r} ({type(value).__name__})")


def _check_gpus(device: str, tensor_parallel_size: int) -> None:
    """The GPUs that ``device`` and ``tensor_parallel_size`` ask for exist (ranks use ``cuda:index + rank``)."""
    if not device.startswith("cuda"):
        return
    import torch

    if not torch.cuda.is_available():
        raise ValueError(f"device={device!r}, but torch {torch.__version__} sees no CUDA GPU (a CPU-only build "
                         "or no driver): use device='cpu'")
    first = int(device.split(":")[1]) if ":" in device else 0
    count = torch.cuda.device_count()
    if first + tensor_parallel_size > count:
        need = f"GPUs {first}..{first + tensor_parallel_size - 1}" if tensor_parallel_size > 1 else f"GPU {first}"
        raise ValueError(f"device={device!r} with tensor_parallel_size={tensor_parallel_size} needs {need}, "
                         f"but torch sees {count} GPU{'s' if count != 1 else ''}")


def _default_device() -> str:
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:  # pragma: no cover
        return "cpu"
