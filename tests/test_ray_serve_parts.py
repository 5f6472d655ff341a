"""The Ray Serve deployment's parts, without a Ray runtime: the prefix index, the router's choices, the merged
``/metrics``, and a replica stream's answer to a replica that dies (retried once before anything streamed, a 503
after)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

pytest.importorskip("ray.serve")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from ray.exceptions import ActorDiedError, RayTaskError  # noqa: E402

from minivllm.entrypoints.openai.metrics import PrometheusStatLogger  # noqa: E402
from minivllm.outputs import CompletionOutput, RequestOutput, StepStats  # noqa: E402
from minivllm.sampling_params import SamplingParams  # noqa: E402
from minivllm.scale_out.serve.metrics import MetricsBoard, merge_replica_metrics, replicas_load  # noqa: E402
from minivllm.scale_out.serve.prefix_index import PrefixIndex, block_hashes  # noqa: E402
from minivllm.scale_out.serve.replica import ReplicaRequest  # noqa: E402
from minivllm.scale_out.serve.replica_stream import ReplicaDiedError  # noqa: E402


def test_block_hashes_chain_full_blocks_only():
    h = block_hashes(list(range(10)), 4)
    assert len(h) == 2  # the last 2 tokens are not a full block
    assert h == block_hashes(list(range(8)), 4)
    assert block_hashes([9, 1, 2, 3, 4, 5, 6, 7], 4)[1] != h[1]  # block 1's hash depends on block 0
    assert block_hashes([1, 2, 3], 4) == []


def test_prefix_index_longest_leading_run_and_lru_capacity():
    idx = PrefixIndex(block_size=2, capacity=3)
    a = block_hashes([1, 2, 3, 4, 5, 6], 2)  # 3 blocks
    b = block_hashes([1, 2, 9, 9], 2)  # shares block 0 with a
    idx.insert("r0", a[:1])
    idx.insert("r1", a)
    assert idx.matched_blocks("r0", a) == 1 and idx.matched_blocks("r1", a) == 3
    assert idx.best(["r0", "r1"], a) == ("r1", 3)
    assert idx.best(["r0", "r1"], b) == ("r0", 1)  # the first on a tie
    assert idx.best(["r0"], block_hashes([7, 7], 2)) == (None, 0)
    idx.insert("r1", b[1:])  # r1 holds 4 > 3 hashes: a's first block goes
    idx.check_integrity()
    assert idx.matched_blocks("r1", a) == 0
    idx.retain({"r1"})
    assert idx.best(["r0", "r1"], a) == (None, 0)
    with pytest.raises(ValueError, match="block_size"):
        PrefixIndex(0)


def _router(imbalance: int = 8):
    from ray.serve._private.common import DeploymentHandleSource, DeploymentID

    from minivllm.scale_out.serve.router import PrefixAwareRouter

    r = PrefixAwareRouter(deployment_id=DeploymentID(name="EngineReplica", app_name="t"),
                          handle_source=DeploymentHandleSource.UNKNOWN, use_replica_queue_len_cache=True)
    r.initialize_state(block_size=4, imbalance=imbalance, seed=0)
    return r


def _pending(prompt) -> SimpleNamespace:
    return SimpleNamespace(args=[ReplicaRequest("r", prompt, SamplingParams())], kwargs={})


def test_router_prefers_the_replica_with_the_prefix_unless_it_is_overloaded():
    router = _router(imbalance=2)
    reps = [SimpleNamespace(replica_id=f"r{i}") for i in range(3)]
    prompt = list(range(12))
    run = lambda p: asyncio.run(router.choose_replicas(reps, _pending(p)))  # noqa: E731

    first = run(prompt)
    assert len(first) == 1 and sorted(r.replica_id for r in first[0]) == ["r0", "r1", "r2"]  # nothing cached
    router.on_request_routed(_pending(prompt), "r1", None)
    ranks = run(prompt[:8] + [99, 99, 99, 99])  # shares two blocks with what r1 ran
    assert [r.replica_id for r in ranks[0]] == ["r1"] and len(ranks[1]) == 2
    router.replica_queue_len_cache.update("r1", 3)  # 3 > 0 + imbalance 2: least-loaded instead
    assert len(run(prompt)) == 1
    router.replica_queue_len_cache.update("r1", 2)
    assert [r.replica_id for r in run(prompt)[0]] == ["r1"]
    assert len(run([5, 5, 5])) == 1  # shorter than a block: least-loaded
    assert len(asyncio.run(router.choose_replicas(reps, None))) == 1  # model_info and the like


def test_merged_metrics_label_every_sample_with_its_replica():
    a, b = PrometheusStatLogger("m"), PrometheusStatLogger("m")
    a.prompt_tokens.inc(3)
    b.prompt_tokens.inc(5)
    b.ttft.observe(0.2)
    text = merge_replica_metrics({"ra": a.render(), "rb": b.render()}).decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    prompt = {s.labels["replica"]: s.value for s in fams["vllm:prompt_tokens"].samples if s.name.endswith("_total")}
    assert prompt == {"ra": 3.0, "rb": 5.0}
    counts = {s.labels["replica"]: s.value for s in fams["vllm:time_to_first_token_seconds"].samples
              if s.name.endswith("_count")}
    assert counts == {"ra": 0.0, "rb": 1.0}
    assert text.count("# TYPE vllm:prompt_tokens_total counter") == 1  # one family, both replicas' samples


def test_the_orca_load_of_replicas_is_their_mean_kv_usage_and_all_their_waiting():
    a, b = PrometheusStatLogger("m"), PrometheusStatLogger("m")
    a.on_step([], StepStats(num_waiting=3, kv_blocks_used=1, kv_blocks_total=4), 0.0)
    b.on_step([], StepStats(num_waiting=2, kv_blocks_used=3, kv_blocks_total=4), 0.0)
    assert a.load_report() == {"kv_cache_usage_perc": 0.25, "num_requests_waiting": 3.0}  # one engine's
    assert replicas_load({"ra": a.render(), "rb": b.render()}) == {"kv_cache_usage_perc": 0.5,
                                                                   "num_requests_waiting": 5.0}
    assert replicas_load({}) == {"kv_cache_usage_perc": 0.0, "num_requests_waiting": 0.0}


def test_metrics_board_forgets_replicas_that_stop_posting():
    board = MetricsBoard(ttl_s=0.05)
    board.post("ra", b"x")
    board.post("rb", b"y")
    board.remove("rb")
    assert board.collect() == {"ra": b"x"}
    import time

    time.sleep(0.06)
    assert board.collect() == {}


class _Call:
    """A fake streaming Serve call: yields its items, raising the exceptions among them; then stays open (as a
    replica's ``generate`` does while its request runs) unless ``ends``."""

    def __init__(self, *items, ends: bool = False):
        self.items, self.ends, self.cancelled = list(items), ends, False

    async def __anext__(self):
        if not self.items:
            if self.ends:
                raise StopAsyncIteration
            await asyncio.Event().wait()
        item = self.items.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item

    def cancel(self):
        self.cancelled = True


def _client(*calls):
    """A ReplicaEngineClient whose ``generate`` calls are ``calls``, in order (no channel is opened)."""
    from minivllm.scale_out.serve.engine_client import ReplicaEngineClient

    sent = []

    def send(request, front_id):
        sent.append(request)
        return calls[len(sent) - 1]

    client = ReplicaEngineClient(SimpleNamespace(options=lambda stream: SimpleNamespace(
        generate=SimpleNamespace(remote=send))), "model")
    client.retries, client.sent = 0, sent
    client.on_retry = lambda: setattr(client, "retries", client.retries + 1)
    client.ensure_channel = lambda replica: None
    client._info = object()  # NOTE: "loaded"
    return client


def _out(text: str, finished: bool) -> RequestOutput:
    return RequestOutput("q", None, [1], [CompletionOutput(0, text, [2], "length" if finished else None)],
                         finished=finished)


async def _run(client, outputs_by_replica: dict[str, list], *, lose_at: int | None = None):
    """Add request "q", deliver the outputs its replica sends (as the channel would), collect the texts."""
    stream = await client.add_request([1], SamplingParams(), "q")
    texts = []
    while True:
        for out in outputs_by_replica.pop(stream.replica, []):
            client._deliver(out)
        try:
            out = await asyncio.wait_for(stream.__aiter__().__anext__(), 5)
        except StopAsyncIteration:
            return stream, texts
        texts.append(out.outputs[0].text)
        if out.finished:
            return stream, texts


def test_a_replica_that_dies_before_anything_streamed_is_retried_once_on_another():
    died = ActorDiedError()
    with pytest.raises(ReplicaDiedError):  # dies at the accept, and again: a 503, not a 500
        asyncio.run(_run(_client(_Call(died), _Call(died)), {}))
    client = _client(_Call(died), _Call("r2"))
    stream, texts = asyncio.run(_run(client, {"r2": [_out("a", False), _out("ab", True)]}))
    assert texts == ["a", "ab"] and client.retries == 1 and len(client.sent) == 2 and stream.replica == "r2"
    assert client._streams == {}  # finished: forgotten


async def _until(condition, timeout: float = 5.0) -> None:
    """Until ``condition()`` holds, the event loop running the other tasks meanwhile."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.001)


def test_a_replica_that_dies_after_accepting_retries_and_is_reported_once():
    async def scenario():
        client = _client(_Call("r1", ActorDiedError()), _Call("r2"))
        stream = await client.add_request([1], SamplingParams(), "q")
        await _until(lambda: stream.replica == "r2")  # the call's watcher sees the death and reopens on r2
        stream.on_lost(ActorDiedError(), "r1")  # the channel reports it as well: no second retry
        await asyncio.sleep(0.05)  # NOTE: time for a (wrong) second retry to show
        client._deliver(_out("x", True))
        return client, stream, [o.outputs[0].text async for o in stream]

    client, stream, texts = asyncio.run(scenario())
    assert texts == ["x"] and client.retries == 1 and stream.replica == "r2"


def test_a_replica_that_dies_after_streaming_ends_the_stream_with_an_error():
    async def scenario():
        client = _client(_Call("r1"), _Call("r2"))
        stream = await client.add_request([1], SamplingParams(), "q")
        client._deliver(_out("a", False))
        got = []
        with pytest.raises(ReplicaDiedError, match="replica died"):
            async for out in stream:
                got.append(out.outputs[0].text)
                stream.on_lost(ActorDiedError(), "r1")
        return client, got

    client, got = asyncio.run(scenario())
    assert got == ["a"] and client.retries == 0 and len(client.sent) == 1


def test_a_request_its_replica_failed_gets_a_503_error():
    from minivllm.scale_out.serve.outbox import RequestFailed

    async def scenario():
        client = _client(_Call("r1"))
        stream = await client.add_request([1], SamplingParams(), "q")
        client._deliver(RequestFailed("q", "the engine failed: boom"))
        return [o async for o in stream]

    with pytest.raises(ReplicaDiedError, match="the engine failed: boom"):
        asyncio.run(scenario())


def test_the_replicas_own_error_reaches_the_handler_unwrapped_and_abort_cancels():
    wrapped = RayTaskError("generate", "Traceback ...", ValueError("temperature must be >= 0"))
    with pytest.raises(ValueError, match="^temperature must be >= 0$"):
        asyncio.run(_run(_client(_Call(wrapped)), {}))
    call = _Call("r1")

    async def first_then_abort():
        client = _client(call)
        stream = await client.add_request([1], SamplingParams(), "q")
        client._deliver(_out("a", False))
        async for _ in stream:
            break
        client._deliver(_out("ab", True))  # a late output of an aborted request is dropped
        return client, stream

    client, stream = asyncio.run(first_then_abort())
    assert stream.finished and call.cancelled and client._streams == {}


def test_app_builder_takes_serve_flags_by_field_name_typed_or_as_strings():
    from ray.serve import Application

    from minivllm.scale_out.serve.app import app_builder, builder_argv

    assert builder_argv({"model": "m", "data_parallel_size": "2", "enable_prefix_caching": "false",
                         "enforce_eager": True, "trust_request_chat_template": "false", "api_key": ["a", "b"],
                         "max_n": 4}) == [
        "m", "--data-parallel-size", "2", "--no-enable-prefix-caching", "--enforce-eager",
        "--api-key", "a", "--api-key", "b", "--max-n", "4"]
    demo = str(__import__("pathlib").Path(__file__).resolve().parents[1] / "models" / "minivllm-demo-py")
    assert isinstance(app_builder({"model": demo, "device": "cpu", "data_parallel_size": "2"}), Application)
    with pytest.raises(ValueError, match="autoscale_max_replicas"):
        app_builder({"model": demo, "device": "cpu", "data_parallel_size": 2, "autoscale_max_replicas": 1})
    with pytest.raises(ValueError, match="bad arguments"):
        app_builder({"model": demo, "no_such_flag": 1})
    with pytest.raises(ValueError, match="needs `model`"):
        app_builder({"data_parallel_size": 2})
