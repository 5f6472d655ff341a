"""``minivllm serve --data-parallel-size 2`` as a real process (CPU, the demo model): it answers OpenAI requests
through both replicas (per-replica metrics), refuses bad flags before Ray starts, and on SIGTERM exits 0 and
leaves no Ray process, nor colour codes or shutdown errors in its log."""

from __future__ import annotations

import concurrent.futures
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("ray.serve")

from tests.helpers.ray_utils import ray_processes  # noqa: E402
from tests.helpers.server_utils import ROOT, running_server  # noqa: E402
from tests.test_ray_serve import DEMO, PROMPTS, _successes  # noqa: E402

ARGS = ["--device", "cpu", "--dtype", "float32", "--max-model-len", "256", "--served-model-name", "demo"]


def test_bad_replica_flags_are_refused_before_ray_starts():
    for flags, field in ((["--data-parallel-size", "2", "--autoscale-max-replicas", "1"], "autoscale_max_replicas"),
                         (["--data-parallel-size", "2", "--gpus-per-replica", "1.5"], "gpus_per_replica")):
        proc = subprocess.run([sys.executable, "-m", "minivllm.entrypoints.cli", "serve", DEMO, *ARGS, *flags],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert proc.returncode != 0 and field in proc.stderr, proc.stderr[-2000:]


@pytest.mark.slow
def test_serve_with_two_replicas_answers_through_both_and_stops_cleanly(tmp_path):
    with running_server(DEMO, [*ARGS, "--data-parallel-size", "2"], tmp_path) as server:
        complete = lambda p: server.client.completions.create(  # noqa: E731
            model="demo", prompt=p, max_tokens=16, temperature=0).choices[0].text
        with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
            assert all(pool.map(complete, PROMPTS))
        deadline = time.monotonic() + 10
        while sum((served := _successes(server.url)).values()) < len(PROMPTS):
            assert time.monotonic() < deadline, served
            time.sleep(0.5)
        assert len(served) == 2 and all(v > 0 for v in served.values()), served
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=90) == 0
    assert ray_processes() == 0
    # the log of a clean run, written to a file: no colour codes, and no error or traceback at the shutdown
    log = (tmp_path / "server.log").read_text()
    assert "(ServeController pid=" in log and "Deleting app" in log, log[-3000:]
    assert "\x1b[" not in log and "graceful_shutdown failed" not in log and "Traceback" not in log, log[-3000:]
