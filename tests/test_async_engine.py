"""AsyncLLM on a fake engine: streaming, continuous batching, aborts, failures, shutdown."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from minivllm.engine.async_engine import AsyncLLM, EngineDeadError, EngineNotReadyError
from minivllm.engine.engine_loop import EngineLoop
from minivllm.engine.protocol import ModelInfo
from minivllm.entrypoints.openai.metrics import PrometheusStatLogger
from minivllm.outputs import CompletionOutput, RequestOutput, StepStats
from minivllm.sampling_params import SamplingParams
from minivllm.structured_outputs_params import StructuredOutputsParams


class CharTokenizer:
    """A token per character (its code point): what the server's tokenization needs of a tokenizer."""

    chat_template = None

    def get_vocab(self) -> dict[str, int]:
        return {chr(i): i for i in range(128)}

    def __len__(self) -> int:
        return 128

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids)


class FakeEngine:
    """Generates "a", "b", "c", ... one token per step for every request; records each batch."""

    def __init__(self, delay: float = 0.002, fail_at_step: int | None = None):
        self.delay, self.fail_at_step = delay, fail_at_step
        self.reqs: dict[str, tuple[list[int], SamplingParams, list[int], float]] = {}
        self.batches: list[set[str]] = []
        self.aborted: list[str] = []
        self.thread_ids: set[int] = set()
        self.closed = False
        self.tokenizer = CharTokenizer()
        self.config = SimpleNamespace(cache_config=SimpleNamespace(kvcache_block_size=16), model_config=SimpleNamespace(
            max_model_len=64, max_logprobs=20, skip_tokenizer_init=False, arch=SimpleNamespace(vocab_size=128)))
        self.num_kvcache_blocks, self.eos_token_ids, self.structured = 8, [0], None

    def add_request(self, prompt, params, request_id=None, stream=False, strict_length=False, lora_request=None):
        self.thread_ids.add(threading.get_ident())
        ids = [ord(c) for c in prompt] if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise ValueError("the prompt is empty")
        self.reqs[request_id] = (ids, params, [], time.monotonic())

    def has_unfinished_requests(self) -> bool:
        return bool(self.reqs)

    def abort_request(self, request_id):
        self.thread_ids.add(threading.get_ident())
        if self.reqs.pop(request_id, None) is not None:
            self.aborted.append(request_id)

    def step(self):
        self.thread_ids.add(threading.get_ident())
        if self.fail_at_step is not None and len(self.batches) >= self.fail_at_step:
            raise RuntimeError("boom")
        time.sleep(self.delay)
        self.batches.append(set(self.reqs))
        outs, now = [], time.monotonic()
        for rid, (ids, params, gen, arrival) in list(self.reqs.items()):
            gen.append(len(gen) % 26)
            done = len(gen) >= params.max_tokens
            c = CompletionOutput(0, "".join(chr(97 + t) for t in gen), list(gen), "length" if done else None,
                                 delta_text=chr(97 + gen[-1]), delta_token_ids=[gen[-1]])
            outs.append(RequestOutput(rid, None, ids, [c], finished=done, arrival_time=arrival,
                                      first_token_time=now, finished_time=now if done else None))
            if done:
                del self.reqs[rid]
        stats = StepStats(num_decode_tokens=len(outs), num_running=len(self.reqs), kv_blocks_used=len(self.reqs),
                          kv_blocks_total=8, step_time=self.delay)
        return outs, stats

    def close(self):
        self.closed = True


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=20))


async def started(engine, **kw) -> AsyncLLM:
    llm = AsyncLLM(lambda: engine, **kw)
    llm.start()
    await llm.wait_ready()
    return llm


def test_stream_deltas_and_metrics():
    engine, stats = FakeEngine(), PrometheusStatLogger("fake")

    async def main():
        llm = await started(engine, stat_loggers=[stats])
        outs = [o async for o in llm.generate("hi", SamplingParams(max_tokens=4), request_id="r1")]
        await llm.shutdown()
        return outs

    outs = run(main())
    assert "".join(o.outputs[0].delta_text for o in outs) == "abcd" == outs[-1].outputs[0].text
    assert [o.finished for o in outs] == [False, False, False, True]
    assert engine.closed and len(engine.thread_ids) == 1 and threading.get_ident() not in engine.thread_ids
    families = {f.name: f for f in text_string_to_metric_families(stats.render().decode())}
    samples = {s.name: s.value for f in families.values() for s in f.samples}
    assert samples["vllm:generation_tokens_total"] == 4 and samples["vllm:prompt_tokens_total"] == 2
    (info,) = families["vllm:cache_config_info"].samples  # the engine's hook, once ready
    assert info.labels["block_size"] == "16" and info.labels["num_gpu_blocks"] == "8"
    assert samples["vllm:e2e_request_latency_seconds_count"] == 1
    assert samples["vllm:inter_token_latency_seconds_count"] == 3


def test_model_info_and_grammars_once_ready():
    async def main():
        llm = AsyncLLM(FakeEngine)
        with pytest.raises(EngineNotReadyError):
            llm.model_info()
        llm.start()
        await llm.wait_ready()
        info = llm.model_info()
        with pytest.raises(ValueError, match="need a tokenizer"):  # the fake engine has no grammar compiler
            await llm.compile_grammar(StructuredOutputsParams(regex="a+"))
        await llm.shutdown()
        return info

    assert run(main()) == ModelInfo(max_model_len=64, vocab_size=128, eos_token_ids=(0,), kvcache_block_size=16,
                                    num_kvcache_blocks=8)


def test_engine_loop_survives_a_broken_stat_logger_and_fails_adds_queued_after_it_died():
    class Broken:
        def on_cache_config(self, block_size, num_blocks, max_model_len): ...

        def on_step(self, outputs, stats, now):
            raise RuntimeError("metrics bug")

        def on_abort(self, request_id, now): ...

    engine, ready, outputs, failed = FakeEngine(fail_at_step=3), threading.Event(), [], []
    loop = EngineLoop(lambda: engine, [Broken()], ready.set, outputs.extend, failed.append)
    loop.start()
    assert ready.wait(10)
    assert loop.add("r", [1, 2], SamplingParams(max_tokens=2)).result(10) == "r"
    with pytest.raises(ValueError, match="empty"):
        loop.add("bad", [], SamplingParams()).result(10)
    deadline = time.monotonic() + 10
    while not failed:  # steps on, past the logger's errors, until the engine fails at its fourth step
        loop.add(f"x{len(outputs)}", [1], SamplingParams(max_tokens=50))
        time.sleep(0.01)
        assert time.monotonic() < deadline
    assert [o.request_id for o in outputs if o.finished][:1] == ["r"] and isinstance(failed[0], RuntimeError)
    with pytest.raises(EngineDeadError):
        loop.add("late", [1], SamplingParams()).result(10)
    loop.stop(10)
    assert engine.closed


def test_bad_request_raises_and_engine_keeps_serving():
    async def main():
        llm = await started(FakeEngine())
        with pytest.raises(ValueError, match="empty"):
            await llm.add_request("", SamplingParams(max_tokens=2))
        outs = [o async for o in llm.generate("ok", SamplingParams(max_tokens=2))]
        await llm.shutdown()
        return outs

    assert run(main())[-1].finished


def test_requests_arriving_mid_flight_join_the_running_batch():
    engine = FakeEngine(delay=0.005)

    async def main():
        llm = await started(engine)
        long = await llm.add_request("long", SamplingParams(max_tokens=30), request_id="long")
        it = aiter(long)
        for _ in range(3):
            await anext(it)
        short = [o async for o in llm.generate("short", SamplingParams(max_tokens=3), request_id="short")]
        rest = [o async for o in it]
        await llm.shutdown()
        return short, rest

    short, rest = run(main())
    assert short[-1].finished and rest[-1].finished and not rest[0].finished  # short ended while long ran
    assert any(b == {"long", "short"} for b in engine.batches)


def test_cancelled_consumer_aborts_its_request():
    engine, aborts = FakeEngine(), []

    class Recorder:
        def on_cache_config(self, block_size, num_blocks, max_model_len): ...

        def on_step(self, outputs, stats, now): ...

        def on_abort(self, request_id, now):
            aborts.append(request_id)

    async def main():
        llm = await started(engine, stat_loggers=[Recorder()])
        got = asyncio.Event()

        async def consume():
            async for _ in llm.generate("x", SamplingParams(max_tokens=10_000), request_id="gone"):
                got.set()

        task = asyncio.create_task(consume())
        await got.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(200):
            if not engine.reqs:
                break
            await asyncio.sleep(0.01)
        await llm.shutdown()

    run(main())
    assert engine.aborted == ["gone"] and aborts == ["gone"] and not engine.reqs


def test_engine_failure_ends_streams_and_marks_not_ready():
    async def main():
        llm = await started(FakeEngine(fail_at_step=2))
        with pytest.raises(EngineDeadError):
            async for _ in llm.generate("x", SamplingParams(max_tokens=10)):
                pass
        assert not llm.is_ready and isinstance(llm.error, RuntimeError)
        with pytest.raises(EngineDeadError):
            await llm.add_request("y", SamplingParams())
        await llm.shutdown()

    run(main())


def test_loading_then_failed_factory():
    def slow_broken_factory():
        time.sleep(0.2)
        raise OSError("no such checkpoint")

    async def main():
        llm = AsyncLLM(slow_broken_factory)
        llm.start()
        assert not llm.is_ready
        with pytest.raises(EngineNotReadyError):
            await llm.add_request("x", SamplingParams())
        with pytest.raises(EngineDeadError, match="no such checkpoint"):
            await llm.wait_ready()
        with pytest.raises(EngineDeadError):
            await llm.add_request("x", SamplingParams())
        await llm.shutdown()

    run(main())


def test_shutdown_aborts_requests_in_flight():
    engine = FakeEngine()

    async def main():
        llm = await started(engine)
        stream = await llm.add_request("x", SamplingParams(max_tokens=10_000))
        it = aiter(stream)
        await anext(it)
        await llm.shutdown()
        rest = [o async for o in it]
        with pytest.raises(EngineNotReadyError):
            await llm.add_request("y", SamplingParams())
        return rest

    rest = run(main())
    assert rest[-1].finished and rest[-1].outputs[0].finish_reason == "abort"
    assert engine.closed and not engine.reqs


def test_a_request_cancelled_before_the_engine_adds_it_is_never_added():
    """A caller cancelled while its request waits in the loop's queue (its client left, or another conversation of
    its batch failed): the loop skips it and goes on (it used to die setting the cancelled future's result)."""
    inside, gate, added = threading.Event(), threading.Event(), []

    class SlowAdd(FakeEngine):
        def add_request(self, prompt, params, request_id=None, **kw):
            if request_id == "first":
                inside.set()
                gate.wait(10)
            added.append(request_id)
            super().add_request(prompt, params, request_id, **kw)

    engine = SlowAdd()

    async def main():
        llm = await started(engine)
        first = asyncio.ensure_future(llm.add_request("hi", SamplingParams(max_tokens=2), "first"))
        await asyncio.to_thread(inside.wait, 10)  # the loop is inside first's add
        second = asyncio.ensure_future(llm.add_request("hi", SamplingParams(max_tokens=2), "second"))
        await asyncio.sleep(0)  # second is queued behind it
        second.cancel()
        with pytest.raises(asyncio.CancelledError):
            await second
        gate.set()
        outs = [o async for o in await first]
        third = [o async for o in llm.generate("yo", SamplingParams(max_tokens=2), request_id="third")]
        error = llm.error
        await llm.shutdown()
        return outs, third, error

    outs, third, error = run(main())
    assert error is None and outs[-1].finished and third[-1].finished
    assert added == ["first", "third"]


def test_app_on_fake_engine_answers_503_while_loading_and_after_failure():
    from fastapi.testclient import TestClient

    from minivllm.entrypoints.openai.api_server import build_app

    gate, engine = threading.Event(), FakeEngine(fail_at_step=1)
    app = build_app(AsyncLLM(lambda: gate.wait(10) and engine), "fake")
    with TestClient(app) as client:
        r = client.get("/health")
        assert r.status_code == 503 and r.json()["error"]["code"] == "engine_not_ready"
        assert client.post("/v1/completions", json={"model": "fake", "prompt": "x"}).status_code == 503
        gate.set()
        deadline = time.monotonic() + 10
        while client.get("/health").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        ok = client.post("/v1/completions", json={"model": "fake", "prompt": "hi", "max_tokens": 1}).json()
        assert ok["choices"][0]["text"] == "a" and ok["usage"] == {"prompt_tokens": 2, "completion_tokens": 1,
                                                                   "total_tokens": 3, "prompt_tokens_details": None,
                                                                   "completion_tokens_details": None}
        r = client.post("/v1/completions", json={"model": "fake", "prompt": "hi", "max_tokens": 5, "stream": True})
        events = [e for e in r.text.split("\n\n") if e]
        assert r.status_code == 200 and events[-1] == "data: [DONE]"
        assert json.loads(events[-2].removeprefix("data: "))["error"]["code"] == "engine_dead"
        r = client.get("/health")
        assert r.status_code == 503 and r.json()["error"]["code"] == "engine_dead"
        assert client.post("/v1/completions", json={"model": "fake", "prompt": "x"}).status_code == 503
    assert engine.closed
