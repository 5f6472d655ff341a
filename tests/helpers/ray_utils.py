"""Ray in tests: whether any of its processes are still running."""

from __future__ import annotations

import subprocess
import time


def ray_processes(wait_s: float = 15.0) -> int:
    """Ray's processes still running after up to ``wait_s`` seconds (they exit a moment after ``shutdown``)."""
    deadline = time.monotonic() + wait_s
    while True:
        out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        n = sum(1 for line in out.splitlines() if "raylet" in line or "gcs_server" in line or line.startswith("ray::"))
        if n == 0 or time.monotonic() > deadline:
            return n
        time.sleep(0.5)
