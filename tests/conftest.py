"""Shared fixtures (tiny Qwen3 checkpoints: tests/helpers/checkpoints.py) and the suite's rules: without a CUDA
device the GPU tier is deselected, and a skip outside ``ALLOWED_SKIPS`` fails the run."""

from __future__ import annotations

import os
import re
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
from tests.helpers.moe_checkpoints import build_moe_checkpoint  # noqa: E402


@pytest.fixture(scope="session")
def tiny_tied_model(tmp_path_factory) -> str:
    return str(build_checkpoint(tmp_path_factory.mktemp("tiny-tied"), "tied", seed=0))


@pytest.fixture(scope="session")
def tiny_untied_model(tmp_path_factory) -> str:
    return str(build_checkpoint(tmp_path_factory.mktemp("tiny-untied"), "untied", seed=1))


@pytest.fixture(scope="session")
def tiny_moe_model(tmp_path_factory) -> str:
    """A tiny Qwen3-MoE checkpoint (8 experts, top-2, a dense layer between sparse ones) with the tiny tokenizer."""
    return str(build_moe_checkpoint(tmp_path_factory.mktemp("tiny-moe"), "qwen3_moe", seed=0))


@pytest.fixture(params=["tied", "untied"])
def tiny_model(request, tiny_tied_model, tiny_untied_model) -> str:
    return tiny_tied_model if request.param == "tied" else tiny_untied_model


def pytest_terminal_summary(terminalreporter, config):
    """The server stress suite's figures (tests/test_server_stress.py), when it ran; the skips that fail the run."""
    from tests.helpers.stress_report import REPORT

    lines = config.stash.get(REPORT, None)
    if lines:
        terminalreporter.write_sep("=", "server stress figures (docs/reliability.md)")
        for line in lines:
            terminalreporter.write_line(line)
    if bad := _unlisted(config):
        terminalreporter.write_sep("=", f"{len(bad)} skipped outside the allowlist (tests/conftest.py "
                                        f"ALLOWED_SKIPS): the run fails", red=True)
        for nodeid, reason in bad:
            terminalreporter.write_line(f"{nodeid}: {reason}")


# ------------------------------------------------------------------ the GPU tier and skips

GPU_DIR = ROOT / "tests" / "gpu"

#: The skips a run may have: a regular expression that matches the whole skip reason -> why that skip is fine.
#: Any other skip fails the run (``pytest_sessionfinish``), so that a test that silently stops running (a module
#: or a file gone missing) is seen. On a machine without CUDA (CI) nothing may skip: the GPU tier is deselected.
ALLOWED_SKIPS: dict[str, str] = {}
#: ... and those allowed only where a CUDA device is present (the whole suite, or tests/gpu, on a GPU machine).
ALLOWED_SKIPS_WITH_A_GPU: dict[str, str] = {
    r"needs [2-8] CUDA GPUs":
        "tensor parallelism, NCCL and the custom all-reduce over 2 or 4 ranks, on a machine with fewer GPUs",
    r"PDL needs compute capability 9\.0\+": "programmatic dependent launch exists from Hopper (sm_90) on",
    r"CPU tensors through the Triton interpreter(; .*)?|the Triton interpreter on CPU tensors"
    r"|the fused kernel runs in Triton's interpreter|the interpreter's own casts":
        "kernels on CPU tensors in Triton's interpreter, which a GPU machine does not use (TRITON_INTERPRET "
        "is unset there); tests/gpu checks the same kernels on the GPU",
    r"checks the no-GPU exit": "benchmarks/tests: a GPU benchmark's clean exit where there is no GPU",
}


def _gpu_tier(item) -> bool:
    return item.get_closest_marker("gpu") is not None or item.path.is_relative_to(GPU_DIR)


def pytest_collection_modifyitems(config, items):
    """No CUDA device: the GPU tier (tests/gpu/, tests marked ``gpu``) is deselected, so that the summary counts
    it apart, and the skips left are the ones that mean something."""
    if CUDA:
        return
    gpu = [item for item in items if _gpu_tier(item)]
    if gpu:
        config.hook.pytest_deselected(items=gpu)
        items[:] = [item for item in items if not _gpu_tier(item)]


class _Skips:
    """Every skip of the run, wherever its test is (a conftest's own report hooks hear only of its folder's)."""

    def __init__(self):
        self.seen: list[tuple[str, str]] = []  # (node id, reason)

    def pytest_runtest_logreport(self, report):
        self._note(report)

    def pytest_collectreport(self, report):
        self._note(report)  # NOTE: a module-level skip (importorskip) skips at collection

    def _note(self, report) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):  # NOTE: an xfail is reported as skipped too
            message = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            self.seen.append((report.nodeid, message.removeprefix("Skipped: ")))


def pytest_configure(config):
    if not config.pluginmanager.has_plugin("minivllm-skips"):
        config.pluginmanager.register(_Skips(), "minivllm-skips")


def _unlisted(config) -> list[tuple[str, str]]:
    skips = config.pluginmanager.get_plugin("minivllm-skips")
    return unlisted_skips(skips.seen) if skips else []


def unlisted_skips(skips: list[tuple[str, str]], cuda: bool = CUDA) -> list[tuple[str, str]]:
    """The (node id, reason) of the skips that no entry of the allowlist explains."""
    allowed = [*ALLOWED_SKIPS, *(ALLOWED_SKIPS_WITH_A_GPU if cuda else ())]
    return [(nodeid, reason) for nodeid, reason in skips
            if not any(re.fullmatch(pattern, reason, re.DOTALL) for pattern in allowed)]


def pytest_sessionfinish(session, exitstatus):
    if _unlisted(session.config) and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
