"""Environment switches shared by the engine and the kernels (no torch import)."""

from __future__ import annotations

import os


def env_switch(name: str, default: bool) -> bool:
    """An on/off environment switch: '1' or '0' (unset: ``default``); anything else is a clear error."""
    flag = os.environ.get(name, "1" if default else "0")
    if flag not in ("0", "1"):
        raise ValueError(f"{name} must be '0' or '1', not {flag!r}")
    return flag == "1"
