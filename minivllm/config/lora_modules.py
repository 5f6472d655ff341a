"""The adapters a server loads at start (``--lora-modules``): ``name=path`` or vLLM's JSON form
``{"name": .., "path": .., "base_model_name": ..}``. Plain data: what an adapter folder holds is checked when the
engine loads it."""

from __future__ import annotations

from dataclasses import dataclass

from minivllm.config.fields import json_config


@dataclass(frozen=True)
class LoRAModulePath:
    """One adapter of ``--lora-modules``: the model name clients use for it, its PEFT folder, and the base model
    ``/v1/models`` lists as its ``parent`` (None: the served model)."""

    name: str
    path: str
    base_model_name: str | None = None

    def __post_init__(self) -> None:
        for key in ("name", "path"):
            value = getattr(self, key)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"lora_modules: {key} must be a non-empty string, got {value!r}")
        if self.base_model_name is not None and (not isinstance(self.base_model_name, str)
                                                 or not self.base_model_name.strip()):
            raise ValueError(f"lora_modules: base_model_name must be a non-empty string, got {self.base_model_name!r}")


def parse_lora_module(spec: str | dict | LoRAModulePath) -> LoRAModulePath:
    """A ``--lora-modules`` entry: ``name=path``, or a JSON object with ``name``, ``path`` and optionally
    ``base_model_name``; ValueError naming ``lora_modules`` and what is wrong."""
    if isinstance(spec, LoRAModulePath):
        return spec
    if isinstance(spec, dict) or (isinstance(spec, str) and spec.lstrip().startswith("{")):
        return json_config(LoRAModulePath, spec, "lora_modules", required=("name", "path"))
    if not isinstance(spec, str) or "=" not in spec:
        raise ValueError(f"lora_modules: each entry is name=path or a JSON object "
                         f'{{"name": .., "path": .., "base_model_name": ..}}, got {spec!r}')
    name, path = spec.split("=", 1)
    return LoRAModulePath(name.strip(), path.strip())


def parse_lora_modules(specs) -> list[LoRAModulePath]:
    """Every entry of ``--lora-modules``; ValueError for a bad one or a name given twice."""
    modules = [parse_lora_module(s) for s in specs]
    seen: set[str] = set()
    for m in modules:
        if m.name in seen:
            raise ValueError(f"lora_modules: the name {m.name!r} is given twice")
        seen.add(m.name)
    return modules
