"""Speculative decoding on a GPU, where the Triton attention kernel verifies several query tokens per decode row,
decode-only steps replay CUDA graphs (steps with drafts run eagerly), the fused sampler and asynchronous
scheduling are on: greedy outputs equal the non-speculative engine's, drafts are accepted, and the steps without
drafts still replay graphs. Not run on the CPU (deselected there)."""

import pytest
import torch

from minivllm import LLM, SamplingParams
from tests.helpers.spec_decode_checks import DEMO_MODEL, NGRAM, REPETITIVE_PROMPTS

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
GREEDY = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
ENGINE = dict(device="cuda", dtype="float32", gpu_memory_utilization=0.3)


@pytest.fixture(scope="module")
def expected():
    with LLM(DEMO_MODEL, **ENGINE) as llm:
        return llm.generate(REPETITIVE_PROMPTS, GREEDY, use_tqdm=False)


@pytest.mark.parametrize("kw", [dict(), dict(enforce_eager=True), dict(attention_backend="torch", enforce_eager=True),
                                dict(max_num_batched_tokens=32)],
                         ids=["graphs", "eager", "torch-attention", "chunked"])
def test_greedy_outputs_equal_no_speculation_on_gpu(expected, kw):
    with LLM(DEMO_MODEL, **ENGINE, speculative_config=NGRAM, **kw) as llm:
        assert llm.engine.async_scheduling  # the GPU default: with drafts, each step resolves before the next
        got = llm.generate(REPETITIVE_PROMPTS, GREEDY, use_tqdm=False)
        totals = llm.engine.spec_totals
    assert [o["token_ids"] for o in got] == [o["token_ids"] for o in expected]
    assert totals.num_accepted_tokens > 0


def test_steps_without_drafts_still_replay_cuda_graphs():
    """One request whose prompt gives no n-gram match at first: its plain decode steps replay a graph; steps
    with drafts (several query tokens a row) run eagerly."""
    with LLM(DEMO_MODEL, **ENGINE, speculative_config=NGRAM) as llm:
        runner = llm.engine.executor.runner
        assert runner.graph_runner is not None
        replays = []
        original = runner.graph_runner.run

        def counting(inp, prev):
            replays.append(inp.num_rows)
            return original(inp, prev)

        runner.graph_runner.run = counting
        llm.generate(["x"], SamplingParams(temperature=0, max_tokens=48, ignore_eos=True), use_tqdm=False)
        assert replays and llm.engine.spec_totals.num_drafts > 0


def test_seeded_sampling_is_reproducible_on_gpu():
    params = [SamplingParams(temperature=0.8, top_p=0.9, seed=s, max_tokens=48, ignore_eos=True) for s in range(4)]
    runs = []
    for _ in range(2):
        with LLM(DEMO_MODEL, **ENGINE, speculative_config=NGRAM) as llm:
            runs.append([o["token_ids"] for o in llm.generate(REPETITIVE_PROMPTS[:4], params, use_tqdm=False)])
    assert runs[0] == runs[1]


def test_large_batches_run_ahead_with_graphs_above_disable_by_batch_size(expected):
    """Above disable_by_batch_size the engine schedules one step ahead and decode steps replay CUDA graphs; the
    batch's tail speculates. Greedy outputs equal no speculation."""
    params = [SamplingParams(temperature=0, max_tokens=16 + 3 * i, ignore_eos=True)
              for i in range(len(REPETITIVE_PROMPTS))]
    with LLM(DEMO_MODEL, **ENGINE) as llm:
        want = llm.generate(REPETITIVE_PROMPTS, params, use_tqdm=False)
    with LLM(DEMO_MODEL, **ENGINE, speculative_config={**NGRAM, "disable_by_batch_size": 4}) as llm:
        runner = llm.engine.executor.runner
        replays, original = [], runner.graph_runner.run
        runner.graph_runner.run = lambda inp, prev: replays.append(prev is not None) or original(inp, prev)
        got = llm.generate(REPETITIVE_PROMPTS, params, use_tqdm=False)
        drafts = llm.engine.spec_totals.num_drafts
    assert [o["token_ids"] for o in got] == [o["token_ids"] for o in want]
    assert any(replays) and drafts > 0  # graphs fed the step in flight's tokens; the tail drafted
