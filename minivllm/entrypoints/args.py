"""Command-line flags generated from config dataclasses: one flag per field declared with ``arg()``.

The engine's flags come from the ``Config`` sub-configs (``--max-num-seqs``), the server's from
``ServerConfig`` (``--api-key``); a field's help, choices and default make its flag's. ``add_serve_args`` makes
``minivllm serve``'s arguments, for the CLI and for the Ray Serve config builder alike.
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING

from minivllm.config import SUB_CONFIGS, Config
from minivllm.config.fields import engine_arg_fields
from minivllm.config.server import ServerConfig

_TYPES = {"int": int, "float": float, "str": str}


def flags_of(*classes) -> list[tuple[str, str, object, dict]]:
    """``(flag, field, type, field metadata + its default)`` of every ``arg()`` field of ``classes``; type None
    is a boolean, ``list`` a repeatable flag."""
    out = []
    for cls in classes:
        for f in engine_arg_fields(cls):
            base = str(f.type).split(" | ")[0]
            typ = None if base == "bool" else list if base.startswith("list[") else _TYPES[base]
            out.append(("--" + f.name.replace("_", "-"), f.name, typ, {**f.metadata, "default": f.default}))
    return out


def engine_flags() -> list[tuple[str, str, object, dict]]:
    """The flags of every engine argument."""
    return flags_of(*SUB_CONFIGS.values(), Config)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """``--help`` with each flag's default after its text (``(default: 8000)``), unless the text already says
    what the default is, or there is none worth showing (None, False: a switch that is off)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if ("default" in text or default is None or default is False or default == [] or default == argparse.SUPPRESS
                or not action.option_strings or isinstance(action, argparse.BooleanOptionalAction)):
            return text
        return f"{text} (default: %(default)s)"


def help_with_default(meta: dict) -> str:
    """A config field's help text with its default (the flag's own argparse default is None: "not given")."""
    text, default = meta["help"], meta.get("default")
    if "default" in text or default is None or default is False or default is MISSING:
        return text
    return f"{text} (default: {default})"


def add_flags(parser: argparse.ArgumentParser, flags, title: str, exclude: tuple[str, ...] = ()) -> None:
    """Add ``flags`` (from :func:`flags_of`) as a group; every default is None = "the config's default", which
    the help text shows."""
    group = parser.add_argument_group(title)
    for flag, name, typ, meta in flags:
        if name in exclude:
            continue
        kw = dict(dest=name, default=None, help=help_with_default(meta))
        if typ is None:  # a switch that is off by default has no --no- form (vLLM's --enforce-eager)
            action = "store_true" if meta.get("default") is False else argparse.BooleanOptionalAction
            group.add_argument(flag, action=action, **kw)
        elif typ is list:
            group.add_argument(flag, action="append", **kw)
        else:
            group.add_argument(flag, type=typ, choices=meta.get("choices"), **kw)


def add_engine_args(parser: argparse.ArgumentParser, exclude: tuple[str, ...] = ()) -> None:
    """One flag per engine argument; booleans get ``--no-X`` where they are on by default."""
    add_flags(parser, engine_flags(), "engine", exclude)
    if "tensor_parallel_size" not in exclude:
        parser.add_argument("-tp", dest="tensor_parallel_size", type=int, default=None, help=argparse.SUPPRESS)


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """The ``MODEL`` argument and one flag per engine argument (``minivllm serve`` and ``generate``)."""
    parser.add_argument("model", help="a local Hugging Face checkpoint folder")
    add_engine_args(parser)


def add_serve_args(parser: argparse.ArgumentParser) -> None:
    """``minivllm serve``'s arguments: ``MODEL``, the engine's flags and the server's (``ServerConfig``)."""
    add_model_args(parser)
    add_flags(parser, flags_of(ServerConfig), "server")


def serve_parser() -> argparse.ArgumentParser:
    """A parser of ``minivllm serve``'s arguments alone (what follows ``serve`` on the command line)."""
    parser = argparse.ArgumentParser(prog="minivllm serve", formatter_class=HelpFormatter)
    add_serve_args(parser)
    return parser


def kwargs_of(args: argparse.Namespace, flags) -> dict:
    """The fields of ``flags`` that the user set on the command line."""
    return {name: getattr(args, name) for _, name, _, _ in flags if getattr(args, name, None) is not None}


def engine_kwargs(args: argparse.Namespace) -> dict:
    """The engine arguments the user set on the command line."""
    return kwargs_of(args, engine_flags())
