"""Shared fixtures: tiny Qwen3 checkpoints (tests/helpers/checkpoints.py: seeded random weights, a trained BPE
tokenizer)."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# NOTE: processes the tests start import this checkout's minivllm too (pytest's `pythonpath` in pyproject.toml
# puts it first on this process's sys.path, not on theirs), not an installed or editable one from elsewhere
if os.environ.get("PYTHONPATH", "").split(os.pathsep)[0] != str(ROOT):
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)

try:
    import torch

    CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover
    CUDA = False
# NOTE: Triton reads TRITON_INTERPRET when a kernel is defined, so it must be set before any
# minivllm.kernels module is imported. Without a GPU the kernels run in the interpreter.
if os.environ.get("TRITON_INTERPRET") is None and not CUDA:
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402

from tests.helpers.checkpoints import build_checkpoint  # noqa: E402


@pytest.fixture(scope="session")
def tiny_tied_model(tmp_path_factory) -> str:
    return str(build_checkpoint(tmp_path_factory.mktemp("tiny-tied"), "tied", seed=0))


@pytest.fixture(scope="session")
def tiny_untied_model(tmp_path_factory) -> str:
    return str(build_checkpoint(tmp_path_factory.mktemp("tiny-untied"), "untied", seed=1))


@pytest.fixture(params=["tied", "untied"])
def tiny_model(request, tiny_tied_model, tiny_untied_model) -> str:
    return tiny_tied_model if request.param == "tied" else tiny_untied_model


def pytest_terminal_summary(terminalreporter, config):
    """The server stress suite's figures (tests/test_server_stress.py), when it ran."""
    from tests.helpers.stress_report import REPORT

    lines = config.stash.get(REPORT, None)
    if lines:
        terminalreporter.write_sep("=", "server stress figures (docs/reliability.md)")
        for line in lines:
            terminalreporter.write_line(line)
