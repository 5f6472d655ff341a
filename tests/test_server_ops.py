"""vLLM's operational behaviours over HTTP, against ``minivllm serve`` of the demo model on a Unix domain socket
(``--uds``)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.server_utils import ROOT

pytestmark = [pytest.mark.server,
              pytest.mark.skipif(not (ROOT / "models" / "minivllm-demo-py").is_dir(), reason="no demo model")]
DEMO = str(ROOT / "models" / "minivllm-demo-py")
NAME = "demo"
ARGS = ["--served-model-name", NAME, "--device", "cpu", "--max-model-len", "512"]


@contextlib.contextmanager
def uds_server(args: list[str], log_path):
    """``minivllm serve DEMO *args --uds SOCKET``; yields an httpx client on that socket once it is healthy."""
    folder = tempfile.mkdtemp(prefix="minivllm-")  # short: a socket's path has ~100 bytes at most
    sock = os.path.join(folder, "serve.sock")
    log = open(log_path, "w+")
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "minivllm.entrypoints.cli", "serve", DEMO, *args, "--uds", sock],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    client = httpx.Client(transport=httpx.HTTPTransport(uds=sock), base_url="http://minivllm", timeout=60)
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, f"server exited early:\n{log.seek(0) or log.read()}"
            assert time.monotonic() < deadline, f"server not healthy in time:\n{log.seek(0) or log.read()}"
            try:
                if client.get("/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        client.sock = sock
        yield client
    finally:
        client.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def http(tmp_path_factory):
    with uds_server(ARGS, tmp_path_factory.mktemp("ops") / "server.log") as client:
        yield client


def metrics(http) -> dict[str, float]:
    """``name{labels but model_name}`` -> value, as ``tests/helpers/server_utils.py`` reads them."""
    return {s.name + json.dumps(dict(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))): s.value
            for f in text_string_to_metric_families(http.get("/metrics").text) for s in f.samples}


def wait_idle(http) -> dict[str, float]:
    deadline = time.monotonic() + 20
    while True:
        m = metrics(http)
        if (m["vllm:num_requests_running{}"] == 0 and m["vllm:num_requests_waiting{}"] == 0
                and m["minivllm_kv_cache_blocks_used{}"] == 0):
            return m
        assert time.monotonic() < deadline, f"server not idle: {m}"
        time.sleep(0.05)


def settle(http) -> dict[str, float]:
    """The metrics once the engine has run every command sent before this (a request sent after them finished:
    the engine takes them in order) and is idle, so that no earlier request's abort lands in a later delta."""
    http.post("/v1/completions", json={"model": NAME, "prompt": "x", "max_tokens": 1})
    return wait_idle(http)


def sse(response: httpx.Response) -> list[dict]:
    lines = [ln.removeprefix("data: ") for ln in response.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(ln) for ln in lines[:-1]]


def error_of(r: httpx.Response, status: int = 400) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


# ------------------------------------------------------------------ --uds
def test_the_server_answers_on_its_unix_socket(http):
    assert os.path.exists(http.sock)
    from minivllm import __version__

    assert http.get("/version").json() == {"version": __version__}
    assert http.get("/v1/models").json()["data"][0]["id"] == NAME


def test_uds_serves_one_engine_only():
    """Ray Serve's proxy serves replicas on --host/--port: --uds with replicas is refused before Ray starts."""
    from minivllm.config.server import ServerConfig
    from minivllm.scale_out.serve.app import build_serve_app

    with pytest.raises(ValueError, match="uds"):
        build_serve_app(DEMO, {"data_parallel_size": 2, "device": "cpu"}, ServerConfig(uds="/tmp/x.sock"))
    with pytest.raises(ValueError, match="uds must be a socket path"):
        ServerConfig(uds="")
