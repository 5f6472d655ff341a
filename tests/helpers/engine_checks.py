"""Engine-against-transformers scenarios shared by the model families' tests (MoE, Mistral, Gemma 3, gpt-oss): a
prefix-cache hit, chunked prefill of long prompts and preemption, each checked token for token (float32, greedy),
and TP=2 against TP=1 over gloo."""

from __future__ import annotations

import torch

from minivllm import LLM, SamplingParams
from tests.test_engine_correctness import GREEDY, PROMPTS, check_against_hf, token_prompts


def check_prefix_cache_hit(path: str) -> None:
    """Four prompts sharing a ~60-token prefix: the second, run after the first, reuses its full blocks; all four
    give transformers' tokens."""
    llm = LLM(path, device="cpu")
    prefix = "def shared_prefix(a, b, c):\n    " + "total = a + b + c\n    " * 6
    prompts = [prefix + tail for tail in ("return total", "print(total)", "x = 1", "pass")]
    ids = token_prompts(llm, prompts)
    first = llm.generate(prompts[:1], GREEDY, use_tqdm=False)
    assert llm.engine.block_manager.num_cached_blocks > 0
    rid = llm.engine.add_request(ids[1], GREEDY)
    outs = []
    while llm.engine.has_unfinished_requests():
        o, _ = llm.engine.step()
        outs += o
    assert outs[-1].request_id == rid and outs[-1].num_cached_tokens >= 32  # full blocks reused
    rest = llm.generate(prompts[2:], GREEDY, use_tqdm=False)
    check_against_hf(path, llm, ids, first + [outs[-1].to_dict()] + rest)


def check_chunked_prefill(path: str, chunk: int, first_chars: int, step_chars: int, min_tokens: int) -> None:
    """Four long prompts (``first_chars`` characters, then ``step_chars`` more each) and four short ones,
    prefilled at most ``chunk`` tokens a step beside decoding rows: transformers' tokens."""
    base = "# " + " ".join(f"word{i}" for i in range(200))
    prompts = [base[: first_chars + step_chars * i] for i in range(4)] + PROMPTS[:4]
    llm = LLM(path, device="cpu", max_num_batched_tokens=chunk, max_model_len=1024)
    ids = token_prompts(llm, prompts)
    assert max(map(len, ids)) >= min_tokens
    outputs = llm.generate(ids, GREEDY, use_tqdm=False)
    check_against_hf(path, llm, ids, outputs)


def check_preemption(path: str) -> None:
    """16 blocks x 16 tokens of cache for the 13 prompts and their 32 new tokens: requests are preempted, and all
    give transformers' tokens."""
    llm = LLM(path, device="cpu", num_kvcache_blocks=16, max_model_len=256)
    outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert llm.engine.scheduler.num_preemptions > 0
    check_against_hf(path, llm, token_prompts(llm, PROMPTS), outputs)


TP_PROMPTS = [[(7 * i + 3 * j + 1) % 380 for j in range(3 + 11 * i)] for i in range(10)]  # 3..102 tokens
TP_GREEDY = SamplingParams(temperature=0, ignore_eos=True, max_tokens=16)


def check_tp2_equals_tp1(path: str) -> None:
    """TP=2 (gloo, one torch thread a rank) gives TP=1's greedy tokens on prompts of 3 to 102 tokens."""

    def tokens(tp: int) -> list[list[int]]:
        with LLM(path, device="cpu", dtype="float32", tensor_parallel_size=tp) as llm:
            return [o["token_ids"] for o in llm.generate(TP_PROMPTS, TP_GREEDY, use_tqdm=False)]

    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert tokens(2) == tokens(1)
    finally:
        torch.set_num_threads(prev)
