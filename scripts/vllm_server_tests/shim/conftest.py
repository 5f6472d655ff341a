"""Staged as ``tests/conftest.py`` (in place of vLLM's, which needs vLLM itself): the fixtures vLLM's server
tests take from it, the deselection of the tests that do not apply (selection.py, with their reasons), a
watchdog per test, and one JSON line per test result for run.py. Written for this harness."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

sys.path.insert(0, os.environ["VLLMTESTS_HARNESS"])
import selection  # noqa: E402

RESULTS = Path(os.environ["VLLMTESTS_RESULTS"])
TEST_TIMEOUT_S = int(os.environ.get("VLLMTESTS_TEST_TIMEOUT_S", "300"))


class LocalAssetServer:
    """vLLM's server of image/audio test assets: only multimodal tests use it, and they are excluded."""

    def url_for(self, name: str) -> str:
        raise RuntimeError("multimodal assets are not served by the minivllm harness")


@pytest.fixture(scope="session")
def local_asset_server() -> LocalAssetServer:
    return LocalAssetServer()


def _record(entry: dict) -> None:
    with RESULTS.open("a") as f:
        f.write(json.dumps(entry) + "\n")


def _rel(nodeid: str) -> str:
    return nodeid.split("tests/entrypoints/", 1)[-1]


def pytest_collection_modifyitems(config, items):
    keep, drop = [], []
    for item in items:
        reason = selection.exclusion_reason(_rel(item.nodeid))
        if reason is None:
            keep.append(item)
        else:
            drop.append(item)
            _record({"nodeid": _rel(item.nodeid), "outcome": "excluded", "message": reason})
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _one_line(report) -> str:
    if report.longrepr is None:
        return ""
    if isinstance(report.longrepr, tuple):  # a skip: (file, line, reason)
        return str(report.longrepr[2])
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr).strip().splitlines()[-1]
    return " ".join(text.split())


def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":
        if report.when != "call" and report.outcome == "skipped":
            outcome = "skipped"
        elif report.when != "call":
            outcome = "error" if report.outcome == "failed" else report.outcome
        else:
            outcome = report.outcome
        if report.when == "teardown" and outcome == "error":
            outcome = "teardown-error"
        _record({"nodeid": _rel(report.nodeid), "outcome": outcome, "when": report.when,
                 "message": _one_line(report)})


def _alarm(signum, frame):
    raise TimeoutError(f"the test ran over {TEST_TIMEOUT_S} s (harness watchdog)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(TEST_TIMEOUT_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
