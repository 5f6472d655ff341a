"""Engine configuration: one ``Config`` composed of validated sub-configs; no file I/O except ``create``.

Every engine argument (``LLM(model, **engine_args)``, a ``minivllm serve`` flag) is a field of exactly one
sub-config, under the same name; ``Config.create`` routes each to its sub-config. Defaults that depend on
another sub-config (the dtype and asynchronous scheduling on the device) are resolved here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from minivllm.config.engine import (
    CacheConfig,
    DeviceConfig,
    ParallelConfig,
    SchedulerConfig,
    StructuredOutputsConfig,
)
from minivllm.config.fields import arg, engine_arg_fields
from minivllm.config.model import ArchConfig, ModelConfig
from minivllm.config.sampling import SamplingConfig, WatermarkConfig
from minivllm.config.speculative import SpeculativeConfig
from minivllm.envs import Envs, read_envs

__all__ = ["ArchConfig", "CacheConfig", "Config", "DeviceConfig", "ModelConfig", "ParallelConfig",
           "SamplingConfig", "SchedulerConfig", "SpeculativeConfig", "StructuredOutputsConfig", "WatermarkConfig"]

#: sub-config attribute of ``Config`` -> its class; every engine argument is a field of one of them
SUB_CONFIGS = {"model_config": ModelConfig, "cache_config": CacheConfig, "scheduler_config": SchedulerConfig,
               "parallel_config": ParallelConfig, "device_config": DeviceConfig,
               "structured_outputs_config": StructuredOutputsConfig, "sampling_config": SamplingConfig}


@dataclass
class Config:
    """Everything an engine needs, validated; built by :meth:`create` from a checkpoint and engine arguments.

    ``speculative_config`` (an engine argument of its own, vLLM's): speculative decoding, None when off.
    ``envs`` is the snapshot of the environment variables read when the engine starts (``minivllm.envs``).
    """

    model_config: ModelConfig
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    device_config: DeviceConfig = field(default_factory=DeviceConfig)
    structured_outputs_config: StructuredOutputsConfig = field(default_factory=StructuredOutputsConfig)
    sampling_config: SamplingConfig = field(default_factory=SamplingConfig)
    speculative_config: str | dict | SpeculativeConfig | None = arg(
        None, "speculative decoding, as vLLM's flag: a JSON object such as "
              "'{\"method\": \"ngram\", \"num_speculative_tokens\": 4}' (keys: method: ngram, eagle, eagle3 or "
              "draft_model; num_speculative_tokens; prompt_lookup_min / prompt_lookup_max: the n-gram lengths tried, "
              "5; model: the draft head's or draft model's folder; draft_tensor_parallel_size; "
              "disable_by_batch_size: no drafts in a step of more sequences than this)")
    envs: Envs = field(default_factory=read_envs)

    def __post_init__(self) -> None:
        mc, sc, dc = self.model_config, self.scheduler_config, self.device_config
        arch = mc.arch
        if self.speculative_config is not None:
            self.speculative_config = SpeculativeConfig.of(self.speculative_config)
            if self.sampling_config.watermark_config is not None:
                raise ValueError("speculative_config cannot be combined with watermark_config: a watermarked token "
                                 "is decided by the watermark's keyed noise, which rejection sampling cannot verify")
        if mc.dtype is None:
            mc.dtype = "float32" if dc.device == "cpu" else arch.dtype
        if sc.async_scheduling is None:
            sc.async_scheduling = dc.device != "cpu"
        if not sc.enable_chunked_prefill and sc.max_num_batched_tokens < mc.max_model_len:
            raise ValueError(
                f"without chunked prefill, max_num_batched_tokens ({sc.max_num_batched_tokens}) must be "
                f">= max_model_len ({mc.max_model_len})")
        tp = self.parallel_config.tensor_parallel_size
        if arch.num_attention_heads % tp:
            raise ValueError(f"num_attention_heads ({arch.num_attention_heads}) must be divisible by "
                             f"tensor_parallel_size ({tp})")
        dense_mlp = any(not arch.is_moe_layer(i) for i in range(arch.num_hidden_layers))
        if dense_mlp and arch.intermediate_size % tp:  # NOTE: unused by a MoE model with no dense layer
            raise ValueError(f"intermediate_size ({arch.intermediate_size}) must be divisible by "
                             f"tensor_parallel_size ({tp}): each rank holds a slice of every dense MLP")
        if arch.is_moe and arch.moe_intermediate_size % tp:
            raise ValueError(f"moe_intermediate_size ({arch.moe_intermediate_size}) must be divisible by "
                             f"tensor_parallel_size ({tp}): each rank holds a slice of every expert")
        if arch.is_moe and dc.device != "cpu" and dc.attention_backend == "torch" and not dc.enforce_eager:
            raise ValueError("a mixture-of-experts model with attention_backend='torch' on a GPU needs "
                             "enforce_eager=True: the torch MoE path reads its experts' loads on the host, which "
                             "a CUDA graph cannot capture")
        if dc.attention_backend == "triton" and dc.device == "cpu" and not self.envs.triton_interpret:
            raise ValueError("attention_backend='triton' on the CPU needs TRITON_INTERPRET=1 (Triton's interpreter, "
                             "slow: for checking kernels); use attention_backend='torch'")

    @staticmethod
    def engine_arg_names() -> dict[str, str]:
        """``{engine argument: the sub-config attribute that holds it}`` (``Config``'s own arguments map to
        themselves)."""
        names = {f.name: attr for attr, cls in SUB_CONFIGS.items() for f in engine_arg_fields(cls)}
        names.update((f.name, f.name) for f in engine_arg_fields(Config))
        return names

    @classmethod
    def create(cls, model, arch: ArchConfig | None = None, **engine_args) -> Config:
        """A validated Config for the checkpoint folder ``model`` (its ``config.json`` is read unless ``arch``
        is given). An unknown engine argument raises TypeError, a bad value ValueError."""
        names = cls.engine_arg_names()
        unknown = sorted(set(engine_args) - set(names))
        if unknown:
            raise TypeError(f"unknown engine argument(s): {', '.join(unknown)}")
        if engine_args.get("device") is None:
            engine_args["device"] = _default_device()
        model = os.fspath(model)  # a pathlib.Path is fine
        if arch is None:
            from minivllm.config.hf import load_arch

            arch = load_arch(model)
        groups: dict[str, dict] = {attr: {} for attr in SUB_CONFIGS}
        own = {}
        for name, value in engine_args.items():
            (groups[names[name]] if names[name] in groups else own)[name] = value
        config = cls(ModelConfig(model, arch, **groups.pop("model_config")),
                     **{attr: SUB_CONFIGS[attr](**kw) for attr, kw in groups.items()}, **own)
        spec = config.speculative_config
        if spec is not None and spec.uses_model and not os.path.isfile(os.path.join(spec.model, "config.json")):
            raise ValueError(f"speculative_config.model {spec.model!r}: no config.json there (a local checkpoint "
                             "folder is needed)")
        _check_gpus(config.device_config.device, config.parallel_config.tensor_parallel_size)
        return config


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
