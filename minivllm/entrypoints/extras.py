"""The optional extras of the package (``pyproject.toml``) and the one-line message when a command needs one that
is not installed: ``minivllm serve`` without fastapi ends with the command that installs it, not a traceback."""

from __future__ import annotations

#: the top-level modules each extra brings (with what they depend on)
EXTRA_MODULES = {
    "server": ("fastapi", "starlette", "uvicorn", "h11", "pydantic", "pydantic_core", "prometheus_client", "httpx"),
    "ray": ("ray",),
}


def missing_extra(exc: ModuleNotFoundError, command: str, extras: tuple[str, ...]) -> str | None:
    """The one-line message for a module of an extra that is not installed, with the command that installs
    ``extras`` (what ``command`` needs); None when the module belongs to no extra."""
    top = (exc.name or "").split(".")[0]
    extra = next((e for e, modules in EXTRA_MODULES.items() if top in modules), None)
    if extra is None:
        return None
    return (f"minivllm: {command} needs the '{extra}' extra, which is not installed (no module named {top!r}); "
            f"install it with: pip install -e \".[{','.join(extras)}]\" (in the minivllm checkout)")
