"""Engine flags for the command line, generated from the ``Config`` fields (one flag per engine argument)."""

from __future__ import annotations

import argparse

from minivllm.config import SUB_CONFIGS
from minivllm.config.fields import engine_arg_fields

_TYPES = {"int": int, "float": float, "str": str}


def engine_flags() -> list[tuple[str, str, object, dict]]:
    """``(flag, engine argument, type, field metadata)`` of every engine argument; type None: a boolean."""
    out = []
    for cls in SUB_CONFIGS.values():
        for f in engine_arg_fields(cls):
            base = str(f.type).split(" | ")[0]
            out.append(("--" + f.name.replace("_", "-"), f.name, None if base == "bool" else _TYPES[base],
                        {**f.metadata, "default": f.default}))
    return out


def add_engine_args(parser: argparse.ArgumentParser, exclude: tuple[str, ...] = ()) -> None:
    """One flag per engine argument (every default None = "the engine's default"); booleans get ``--no-X``."""
    group = parser.add_argument_group("engine")
    for flag, name, typ, meta in engine_flags():
        if name in exclude:
            continue
        kw = dict(dest=name, default=None, help=meta["help"])
        if typ is None:  # NOTE: a switch that is off by default has no --no- form (vLLM's --enforce-eager)
            action = "store_true" if meta.get("default") is False else argparse.BooleanOptionalAction
            group.add_argument(flag, action=action, **kw)
        else:
            group.add_argument(flag, type=typ, choices=meta.get("choices"), **kw)
    if "tensor_parallel_size" not in exclude:
        group.add_argument("-tp", dest="tensor_parallel_size", type=int, default=None, help=argparse.SUPPRESS)


def engine_kwargs(args: argparse.Namespace) -> dict:
    """The engine arguments the user set on the command line."""
    return {name: getattr(args, name) for _, name, _, _ in engine_flags() if getattr(args, name, None) is not None}


__all__ = ["add_engine_args", "engine_flags", "engine_kwargs"]
