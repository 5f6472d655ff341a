"""The Ray Serve deployment on a local Ray runtime (CPU, the demo model), through the ``openai`` client: two
replicas give one engine's greedy outputs, both serve (per-replica metrics), a shared prompt prefix stays on one
replica, a killed replica fails only its own streams and is replaced, and autoscaling adds a replica under load."""

from __future__ import annotations

import concurrent.futures
import json
import time
from pathlib import Path

import pytest

pytest.importorskip("ray.serve")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from minivllm import LLM, SamplingParams  # noqa: E402
from minivllm.config.server import ServerConfig  # noqa: E402
from tests.helpers.ray_utils import ray_processes  # noqa: E402
from tests.helpers.server_utils import free_port  # noqa: E402

pytestmark = pytest.mark.slow

DEMO = str(Path(__file__).resolve().parents[1] / "models" / "minivllm-demo-py")
KW = dict(device="cpu", dtype="float32", max_model_len=256)
PROMPTS = ["def fibonacci(n):", "import os\n", "class Stack:", "for i in range(", "# parse the header\n",
           "def main():", "while True:", "try:\n"]


@pytest.fixture(scope="module")
def serve_url():
    import ray
    from ray import serve

    ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
    port = free_port()
    serve.start(http_options=dict(host="127.0.0.1", port=port))
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()
    assert ray_processes() == 0


def _deploy(url: str, **server) -> openai.OpenAI:
    from ray import serve

    from minivllm.scale_out.serve.app import build_serve_app

    engine = {**KW, "data_parallel_size": server.pop("data_parallel_size", 2)}
    serve.run(build_serve_app(DEMO, engine, ServerConfig(served_model_name="demo", **server)), name="minivllm",
              route_prefix="/")
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=60)


def per_replica(url: str, name: str) -> dict[str, float]:
    """``{replica: value}`` of one sample name in the front's ``/metrics``."""
    text = httpx.get(f"{url}/metrics").text
    return {s.labels["replica"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == name and "replica" in s.labels}


def _successes(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    text = httpx.get(f"{url}/metrics").text
    for f in text_string_to_metric_families(text):
        for s in f.samples:
            if s.name == "vllm:request_success_total":
                out[s.labels["replica"]] = out.get(s.labels["replica"], 0) + s.value
    return out


def _wait_for(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def test_two_replicas_give_one_engines_outputs_through_both(serve_url):
    client = _deploy(serve_url)
    with LLM(DEMO, **KW) as one:
        want = one.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True), use_tqdm=False)
    complete = lambda p: client.completions.create(  # noqa: E731
        model="demo", prompt=p, max_tokens=24, temperature=0, extra_body={"ignore_eos": True}).choices[0].text
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        got = list(pool.map(complete, PROMPTS))
    assert got == [w["text"] for w in want]
    # each replica posts its metrics every second; both served some of the 8 concurrent requests
    served = _wait_for(lambda: (s := _successes(serve_url)) and sum(s.values()) == len(PROMPTS) and s, 10,
                       "the metrics of all requests")
    assert len(served) == 2 and all(v > 0 for v in served.values()), served

    stream = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=12, temperature=0, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    whole = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=12, temperature=0).choices[0].message.content
    assert streamed == whole
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model="demo", prompt="x", max_tokens=4, temperature=-1)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other", prompt="x", max_tokens=4)


def test_a_shared_prompt_prefix_stays_on_one_replica(serve_url):
    client = _deploy(serve_url)
    prefix = "".join(f"# line {i}: the shared preamble of a long prompt\n" for i in range(6))  # > 3 KV blocks
    before = _successes(serve_url)
    for i in range(5):
        client.completions.create(model="demo", prompt=prefix + f"def f{i}(", max_tokens=4, temperature=0)
    after = _wait_for(lambda: (s := _successes(serve_url)) and sum(s.values()) - sum(before.values()) == 5 and s,
                      10, "the metrics of the 5 requests")
    replicas = per_replica(serve_url, "vllm:num_requests_running")
    grown = {r: after.get(r, 0) - before.get(r, 0) for r in replicas}
    assert len(replicas) == 2 and sorted(grown.values()) == [0, 5], grown
    hits = per_replica(serve_url, "vllm:prefix_cache_hits_total")
    assert hits[max(grown, key=grown.get)] >= 4 * 48  # 4 requests found >= 3 blocks of 16 tokens cached


def test_a_killed_replica_fails_its_own_streams_and_is_replaced(serve_url):
    import ray

    client = _deploy(serve_url)

    def stream(i: int) -> str:
        chunks = client.completions.create(model="demo", prompt=PROMPTS[i], max_tokens=200, temperature=0,
                                           stream=True, extra_body={"ignore_eos": True})
        n = 0
        try:
            for c in chunks:
                n += len(c.choices[0].text) if c.choices else 0
                if n and not started[i]:
                    started[i] = time.monotonic()
        except openai.APIError as e:
            return f"error: {e}"
        return "done"

    started = [0.0] * 4
    replicas = [n["name"] for n in ray.util.list_named_actors(all_namespaces=True)
                if "EngineReplica" in n["name"] and n["namespace"] == "serve"]
    assert len(replicas) == 2
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = []
        for i in range(4):  # NOTE: one at a time, so the router sees each queue grow and spreads them over both
            futures.append(pool.submit(stream, i))
            _wait_for(lambda i=i: started[i], 60, f"stream {i} to start")
        ray.kill(ray.get_actor(replicas[0], namespace="serve"), no_restart=True)
        results = [f.result(timeout=120) for f in futures]  # NOTE: no hang: each ends, with its text or an error
    assert "done" in results and any(r.startswith("error") for r in results), results
    assert all("replica died" in r for r in results if r.startswith("error")), results
    # new requests keep being answered (one routed to the dead replica is retried on the other)
    for p in PROMPTS[:4]:
        assert client.completions.create(model="demo", prompt=p, max_tokens=4, temperature=0).choices[0].text
    # Serve starts a replacement: two replicas post metrics again, and the new one serves
    _wait_for(lambda: len(per_replica(serve_url, "vllm:num_requests_running")) == 2
              and replicas[0].split("#")[-1] not in per_replica(serve_url, "vllm:num_requests_running"), 90,
              "a replacement replica")


def test_autoscaling_adds_a_replica_while_queues_are_long(serve_url):
    client = _deploy(serve_url, data_parallel_size=1, autoscale_max_replicas=2, autoscale_target_ongoing_requests=2)
    stop = time.monotonic() + 90

    def load(i: int) -> int:
        n = 0
        while time.monotonic() < stop and len(per_replica(serve_url, "vllm:num_requests_running")) < 2:
            client.completions.create(model="demo", prompt=PROMPTS[i], max_tokens=120, temperature=0,
                                      extra_body={"ignore_eos": True})
            n += 1
        return n

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        sent = sum(pool.map(load, range(8)))
    replicas = per_replica(serve_url, "vllm:num_requests_running")
    assert len(replicas) == 2, f"still {len(replicas)} replica(s) after {sent} requests: {json.dumps(replicas)}"
