"""The whole engine against transformers: greedy tokens must match exactly (float32, CPU)."""


from minivllm import LLM, SamplingParams
from tests.helpers.hf_reference import hf_greedy

GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)

PROMPTS = [
    "def fibonacci(n):",
    "import os",
    "x",
    "class Stack:\n    def __init__(self):\n        self.items = []",
    "for i in range(10):\n    print(i)",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "héllo wörld — naïve café ✓ 你好世界 🙂",
    "return",
    "    if self.width <= 0:\n        raise ValueError('invalid width %r (must be > 0)' % self.width)\n",
    "# " + "comment " * 25,
    "a = [1, 2, 3]\nb = {k: v for k, v in zip(a, a)}",
    "while True:\n    pass",
    "from collections import deque\nq = deque()\nq.append(1)\n",
]


def token_prompts(llm, prompts):
    return [llm.get_tokenizer().encode(p) for p in prompts]


def check_against_hf(path, llm, prompt_ids, outputs, max_new=32):
    for ids, out in zip(prompt_ids, outputs):
        assert out["token_ids"] == hf_greedy(path, ids, max_new), f"mismatch for prompt {ids[:8]}..."


def test_greedy_matches_transformers(tiny_model):
    llm = LLM(tiny_model, device="cpu")
    ids = token_prompts(llm, PROMPTS)
    assert len(set(map(len, ids))) >= 8  # prompts of different lengths
    outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert len(outputs) == len(PROMPTS)
    check_against_hf(tiny_model, llm, ids, outputs)
    # token-id prompts give the same result, and text is the decode of the ids
    again = llm.generate(ids[:3], GREEDY, use_tqdm=False)
    assert [o["token_ids"] for o in again] == [o["token_ids"] for o in outputs[:3]]
    assert outputs[0]["text"] == llm.engine.decode(outputs[0]["token_ids"])


def test_prefix_cache_hits_and_stays_correct(tiny_tied_model):
    llm = LLM(tiny_tied_model, device="cpu")
    prefix = "def shared_prefix(a, b, c):\n    " + "total = a + b + c\n    " * 6
    prompts = [prefix + tail for tail in ("return total", "print(total)", "x = 1", "pass")]
    ids = token_prompts(llm, prompts)
    assert len(llm.get_tokenizer().encode(prefix)) >= 48
    first = llm.generate(prompts[:1], GREEDY, use_tqdm=False)
    hits_before = llm.engine.block_manager.num_cached_blocks
    assert hits_before > 0
    rid = llm.engine.add_request(ids[1], GREEDY)
    outs = []
    while llm.engine.has_unfinished_requests():
        o, _ = llm.engine.step()
        outs += o
    assert outs[-1].request_id == rid and outs[0].num_cached_tokens >= 32  # full blocks reused
    rest = llm.generate(prompts[2:], GREEDY, use_tqdm=False)
    check_against_hf(tiny_tied_model, llm, ids, first + [outs[-1].to_dict()] + rest)


def test_preemption_recompute_is_correct(tiny_model):
    # 16 blocks x 16 tokens = 256 tokens of cache for 13 prompts of up to ~70 tokens + 32 new
    llm = LLM(tiny_model, device="cpu", num_kvcache_blocks=16, max_model_len=256)
    outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert llm.engine.scheduler.num_preemptions > 0
    check_against_hf(tiny_model, llm, token_prompts(llm, PROMPTS), outputs)
    assert llm.engine.block_manager.num_used_blocks == 0


def test_chunked_prefill_with_preemption_matches_unconstrained(tiny_tied_model):
    base = "# " + " ".join(f"word{i}" for i in range(200))
    prompts = [base[: 480 + 40 * i] for i in range(4)] + PROMPTS[:4]
    free = LLM(tiny_tied_model, device="cpu")
    ids = token_prompts(free, prompts)
    assert max(map(len, ids)) >= 300
    expected = free.generate(ids, GREEDY, use_tqdm=False)
    tight = LLM(tiny_tied_model, device="cpu", max_num_batched_tokens=32, num_kvcache_blocks=40, max_model_len=512)
    got = tight.generate(ids, GREEDY, use_tqdm=False)
    assert tight.engine.scheduler.num_preemptions > 0
    assert [o["token_ids"] for o in got] == [o["token_ids"] for o in expected]
    check_against_hf(tiny_tied_model, free, ids[:5], expected[:5])


def test_mixed_step_and_short_request_overtakes_long_prefill(tiny_tied_model):
    llm = LLM(tiny_tied_model, device="cpu", max_num_batched_tokens=32, max_num_seqs=4)
    # stream=True: the engine reports every new token (offline requests report only at the end)
    short = llm.engine.add_request("def f(x):", SamplingParams(temperature=0, max_tokens=40, ignore_eos=True), stream=True)
    llm.engine.step()  # short is prefilled and starts decoding
    long_ids = llm.get_tokenizer().encode("# " + " ".join(f"token{i}" for i in range(150)))
    assert len(long_ids) > 200
    long = llm.engine.add_request(long_ids, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), stream=True)
    saw_mixed = False
    short_tokens_during_long_prefill = 0
    long_started = False
    while llm.engine.has_unfinished_requests():
        outputs, stats = llm.engine.step()
        got = {o.request_id for o in outputs}
        if stats.num_prefill_tokens > 0 and stats.num_decode_tokens > 0:
            saw_mixed = True
            assert stats.num_prefill_tokens + stats.num_decode_tokens <= 32
        if long in got:
            long_started = True
        if not long_started and short in got:
            short_tokens_during_long_prefill += 1
    assert saw_mixed
    assert short_tokens_during_long_prefill >= 5  # the long prompt took several chunked steps


def test_short_request_first_token_while_long_prompt_prefills(tiny_tied_model):
    # the long prompt arrives first; a per-step chunk cap leaves budget for the short one
    llm = LLM(tiny_tied_model, device="cpu", max_num_batched_tokens=32, long_prefill_threshold=16)
    long_ids = llm.get_tokenizer().encode("# " + " ".join(f"token{i}" for i in range(150)))
    long = llm.engine.add_request(long_ids, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), stream=True)
    short = llm.engine.add_request("def f(x):", SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), stream=True)
    first_token_step = {}
    step = 0
    while llm.engine.has_unfinished_requests():
        outputs, stats = llm.engine.step()
        assert stats.num_prefill_tokens + stats.num_decode_tokens <= 32
        for o in outputs:
            first_token_step.setdefault(o.request_id, step)
        step += 1
    assert first_token_step[short] == 0  # admitted next to the long prompt's first 16-token chunk
    assert first_token_step[long] >= len(long_ids) // 16 - 1  # ~len/16 chunked steps
    assert first_token_step[short] < first_token_step[long]


def test_startup_steps_leave_the_engine_working(tiny_tied_model):
    """The runner's start-up steps on the CPU: the profiling forward (a GPU step, here run directly) binds a
    throw-away cache and leaves the layers without one; the KV cache sizing and the sampling warm-up ran at
    start-up; re-binding the cache restores generation, with the same greedy tokens."""
    from minivllm.worker import kv_cache

    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    with LLM(tiny_tied_model, device="cpu", max_model_len=256, max_num_seqs=4, num_kvcache_blocks=40) as llm:
        runner = llm.engine.executor.runner
        assert runner.num_kvcache_blocks == llm.engine.num_kvcache_blocks == 40
        cache = runner.kv_cache  # [2, layers, blocks, block_size, kv_heads, head_dim]
        assert cache.shape[2] == 40 and cache.numel() * cache.element_size() == 40 * kv_cache.block_bytes(
            runner.attn_layers, runner.block_size, runner.kv_dtype)
        expected = [o["token_ids"] for o in llm.generate(["a b c", "d e"], greedy, use_tqdm=False)]
        runner._profile_run()
        assert all(layer.k_cache.numel() == 0 for layer in runner.attn_layers)
        kv_cache.bind_cache(runner.attn_layers, cache)
        runner._warm_up_sampling()
        assert [o["token_ids"] for o in llm.generate(["a b c", "d e"], greedy, use_tqdm=False)] == expected
