"""Ray in tests: whether any of its processes that this test run started are still running."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

# NOTE: the mark of this run's processes: Ray's (like any process started from here) inherit it. Other runs on a
# shared machine have Ray processes of their own, which must not count.
os.environ.setdefault("TESTS_RUN_ID", str(os.getpid()))
_MARK = f"TESTS_RUN_ID={os.environ['TESTS_RUN_ID']}".encode()


def _ours(pid: str) -> bool:
    try:
        return _MARK in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:  # NOTE: gone already, or not ours to read
        return False


def ray_processes(wait_s: float = 15.0) -> int:
    """This run's Ray processes still running after up to ``wait_s`` seconds (they exit a moment after
    ``shutdown``)."""
    deadline = time.monotonic() + wait_s
    while True:
        out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
        n = sum(1 for line in out.splitlines() if (parts := line.split(None, 1))[1:]
                and ("raylet" in parts[1] or "gcs_server" in parts[1] or parts[1].startswith("ray::"))
                and _ours(parts[0]))
        if n == 0 or time.monotonic() > deadline:
            return n
        time.sleep(0.5)
