"""How config fields are declared and type-checked: every engine argument is a dataclass field with a help
text (the CLI flag is generated from it), checked for its type before any range check runs."""

from __future__ import annotations

import json
import numbers
from dataclasses import MISSING, Field, field, fields

# the annotations are strings (``from __future__ import annotations``); a field whose type is not
# listed here (a nested config, a dict) is not checked
_SCALARS = {"int": numbers.Integral, "float": numbers.Real, "bool": bool, "str": str}


def arg(default=MISSING, help: str = "", *, choices: tuple[str, ...] | None = None) -> Field:
    """A field that is an engine argument: ``help`` and ``choices`` become its CLI flag's."""
    return field(default=default, metadata={"help": help, "choices": choices})


def engine_arg_fields(cls) -> list[Field]:
    """The fields of a config dataclass that are engine arguments (declared with :func:`arg`)."""
    return [f for f in fields(cls) if "help" in f.metadata]


def check_types(config) -> None:
    """A clear error for an argument of the wrong type (``tensor_parallel_size="2"``), before any comparison
    raises a confusing one. bool is not accepted as a number; numpy integers and floats are."""
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
        choices = f.metadata.get("choices")
        if choices and value not in choices:
            raise ValueError(f"{f.name} must be one of {', '.join(map(repr, choices))}, got {value!r}")


def at_least(name: str, value, minimum) -> None:
    """``ValueError`` unless ``value >= minimum``."""
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def json_config(cls, value, name: str, required: tuple[str, ...] = ()):
    """A config dataclass ``cls`` from itself, a dict or the JSON text of one (a flag like vLLM's
    ``--watermark-config '{"key": 42}'``); ValueError naming ``name`` for bad JSON, an unknown or missing key."""
    if isinstance(value, cls):
        return value
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ValueError(f"{name} must be a JSON object: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a JSON object, got {value!r}")
    known = {f.name for f in fields(cls) if f.init}
    unknown = sorted(set(value) - known)
    if unknown:
        raise ValueError(f"{name}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    missing = [k for k in required if k not in value]
    if missing:
        raise ValueError(f"{name} needs {', '.join(missing)}")
    return cls(**value)
