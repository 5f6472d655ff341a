"""Environment switches shared by the engine and the kernels (no torch import)."""

from __future__ import annotations

import os


def env_switch(name: str, default: bool) -> bool:
    """An on/off environment switch: '1' or '0' (unset: ``default``); anything else is a clear error."""
    flag = os.environ.get(name, "1" if default else "0")
    if flag not in ("0", "1"):
        raise ValueError(f"{name} must be '0' or '1', not {flag!r}")
    return flag == "1"


def env_int(name: str, default: int, minimum: int = 0, what: str = "a count") -> int:
    """A non-negative integer environment setting (unset: ``default``); a value below ``minimum`` or not an
    integer is a clear error."""
    text = os.environ.get(name)
    if text is None:
        return default
    if not text.isdigit() or int(text) < minimum:
        raise ValueError(f"{name} must be {what} (an integer >= {minimum}), not {text!r}")
    return int(text)
