"""Data parallelism offline on a local Ray runtime (CPU): ``LLM(model, data_parallel_size=2)`` gives one engine's
greedy outputs in prompt order, through ``generate`` and ``chat``; bad input is the replica's own ValueError;
closing stops Ray and leaves no Ray processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from minivllm import LLM, SamplingParams
from minivllm.scale_out.data_parallel import shard_bounds
from tests.helpers.ray_utils import ray_processes

DEMO = str(Path(__file__).resolve().parents[1] / "models" / "minivllm-demo-py")
KW = dict(device="cpu", dtype="float32", max_model_len=256)
PROMPTS = ["def fibonacci(n):", "import os\n", "class Stack:", "for i in range(", "# parse the header\n"]
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


def test_shard_bounds_are_contiguous_and_balanced():
    assert shard_bounds(5, 2) == [(0, 3), (3, 5)]
    assert shard_bounds(2, 3) == [(0, 1), (1, 2), (2, 2)]
    for n in range(12):
        for k in range(1, 5):
            b = shard_bounds(n, k)
            assert b[0][0] == 0 and b[-1][1] == n and all(b[i][1] == b[i + 1][0] for i in range(k - 1))
            sizes = [hi - lo for lo, hi in b]
            assert max(sizes) - min(sizes) <= 1


def test_data_parallel_size_is_validated_before_ray_starts():
    with pytest.raises(ValueError, match="data_parallel_size"):
        LLM(DEMO, data_parallel_size=0, **KW)


@pytest.mark.parametrize("sizes", [dict(data_parallel_size=0), dict(tensor_parallel_size=0)])
def test_generate_dataset_validates_sizes_first(sizes):
    from minivllm.scale_out.ray_data import generate_dataset

    with pytest.raises(ValueError, match="data_parallel_size and tensor_parallel_size must be >= 1"):
        generate_dataset(None, DEMO, **sizes)


@pytest.mark.slow
def test_two_replicas_give_one_engines_outputs_in_order():
    pytest.importorskip("ray")
    conversations = [[{"role": "user", "content": f"Write a function number {i}."}] for i in range(3)]
    with LLM(DEMO, **KW) as one:
        want = one.generate(PROMPTS, GREEDY, use_tqdm=False)
        want_chat = one.chat(conversations, GREEDY, use_tqdm=False)
    with LLM(DEMO, data_parallel_size=2, **KW) as llm:
        assert isinstance(llm, LLM) and type(llm.engine).__name__ == "DataParallelEngine"
        got = llm.generate(PROMPTS, GREEDY)
        got_chat = llm.chat(conversations, GREEDY)
        assert llm.generate(PROMPTS[0], GREEDY)[0]["token_ids"] == want[0]["token_ids"]  # one prompt: one replica
        with pytest.raises(ValueError, match="1 sampling params for 5 prompts"):
            llm.generate(PROMPTS, [GREEDY])
        with pytest.raises(ValueError, match="max_model_len"):  # the replica's own error, not a Ray wrapper's
            llm.generate(PROMPTS[:3] + [[5] * 300], GREEDY)
        assert llm.generate(PROMPTS[1:3], GREEDY)[1]["token_ids"] == want[2]["token_ids"]  # still serving
    for g, w in zip(got + got_chat, want + want_chat):
        assert (g["token_ids"], g["text"], g["finish_reason"]) == (w["token_ids"], w["text"], w["finish_reason"])
    assert ray_processes() == 0  # Ray started here, and stopped by close()


def test_one_engine_refuses_data_parallel_size():
    from minivllm.engine.llm_engine import LLMEngine

    with pytest.raises(ValueError, match="data_parallel_size"):
        LLMEngine(DEMO, data_parallel_size=2, **KW)


@pytest.mark.slow
def test_ray_data_keeps_rows_and_order_and_gives_one_engines_outputs():
    """``generate_dataset`` over a Ray Dataset with 2 replicas: every input column and the row order are kept,
    and the added outputs are one engine's greedy outputs."""
    ray = pytest.importorskip("ray")
    pytest.importorskip("ray.data")
    from minivllm.scale_out.ray_data import generate_dataset

    prompts = PROMPTS * 3  # 15 rows in 8 batches of 2 (the last one short)
    with LLM(DEMO, **KW) as one:
        want = one.generate(prompts, GREEDY, use_tqdm=False)
    ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        ds = ray.data.from_items([{"row": i, "prompt": p, "tag": f"t{i}"} for i, p in enumerate(prompts)])
        rows = generate_dataset(ds, DEMO, GREEDY, data_parallel_size=2, batch_size=2, **KW).take_all()
    finally:
        ray.shutdown()
    assert [r["row"] for r in rows] == list(range(len(prompts)))
    assert [r["tag"] for r in rows] == [f"t{i}" for i in range(len(prompts))]
    assert [list(r["generated_token_ids"]) for r in rows] == [w["token_ids"] for w in want]
    assert [r["generated_text"] for r in rows] == [w["text"] for w in want]
    assert {r["finish_reason"] for r in rows} == {"length"}
    assert ray_processes() == 0


@pytest.mark.slow
def test_a_killed_replica_is_retried_elsewhere_and_restarted(monkeypatch, tmp_path):
    """A replica killed in the middle of ``generate``: its prompts run again on the other replica (the outputs are
    still one engine's), Ray restarts it, and the next ``generate`` uses both again. No hang."""
    ray = pytest.importorskip("ray")
    import os
    import threading
    import time

    from minivllm.scale_out import data_parallel

    class Replica(data_parallel._Replica):
        """A replica that leaves a file when a batch starts (the actors are other processes)."""

        def run_batch(self, prompts, params, lora_requests=None):
            (tmp_path / f"generating-{os.getpid()}").touch()
            return super().run_batch(prompts, params, lora_requests)

    monkeypatch.setattr(data_parallel, "_Replica", Replica)
    long = SamplingParams(temperature=0, max_tokens=240, ignore_eos=True)
    many = PROMPTS * 4
    with LLM(DEMO, **KW) as one:
        want = one.generate(many, long, use_tqdm=False)
        want_short = one.generate(PROMPTS, GREEDY, use_tqdm=False)
    with LLM(DEMO, data_parallel_size=2, **KW) as llm:
        got = {}
        worker = threading.Thread(target=lambda: got.update(out=llm.generate(many, long)))
        worker.start()
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("generating-*"))) < 2:  # until both replicas are generating
            assert worker.is_alive() and time.monotonic() < deadline
            time.sleep(0.05)
        assert worker.is_alive()
        ray.kill(llm.engine._replicas[0], no_restart=False)
        worker.join(timeout=120)
        assert not worker.is_alive() and [o["token_ids"] for o in got["out"]] == [w["token_ids"] for w in want]
        assert ray.get(llm.engine._replicas[0].ready.remote(), timeout=120) > 0  # restarted
        assert [o["token_ids"] for o in llm.generate(PROMPTS, GREEDY)] == [w["token_ids"] for w in want_short]
    assert ray_processes() == 0
