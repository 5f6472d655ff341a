"""Multi-LoRA end to end on the CPU: greedy tokens equal transformers + peft (float32) for every adapter, in
mixed batches of several adapters and the base model, with fewer device slots than adapters, across the dense
families (Qwen3, Llama, Qwen2, Mistral, Gemma 3), Qwen3-MoE's attention, at TP=2; chunked prefill and
preemption; prefix caching keyed on the adapter; add/remove/list, and the async engine."""

from __future__ import annotations

import asyncio

import pytest
import torch

from minivllm import LLM, LoRARequest, SamplingParams
from minivllm.engine.async_engine import AsyncLLM
from tests.helpers.lora_adapters import (
    ALL_SEVEN,
    ATTENTION,
    MLP,
    build_dense_checkpoint,
    build_lora_adapter,
    peft_greedy,
)
from tests.test_engine_correctness import PROMPTS as CODE_PROMPTS

GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
PROMPTS = CODE_PROMPTS[:8]  # of different lengths, 1 to 30 tokens
#: (targets, r, alpha, rsLoRA) of the three adapters every base model gets
ADAPTERS = [(ALL_SEVEN, 8, 16, False), (ATTENTION, 4, 8, True), (MLP, 16, 32, False)]
KW = dict(device="cpu", dtype="float32", enable_lora=True, max_lora_rank=16)


def make_adapters(base: str, tmp_path_factory, name: str) -> list[LoRARequest]:
    out = []
    for i, (targets, r, alpha, rslora) in enumerate(ADAPTERS, 1):
        path = build_lora_adapter(base, tmp_path_factory.mktemp(f"{name}-lora{i}"), targets, r, alpha, rslora,
                                  seed=i)
        out.append(LoRARequest(f"{name}-{i}", i, str(path)))
    return out


@pytest.fixture(scope="module")
def qwen3_loras(tiny_tied_model, tmp_path_factory) -> list[LoRARequest]:
    return make_adapters(tiny_tied_model, tmp_path_factory, "qwen3")


def prompt_ids(llm: LLM) -> list[list[int]]:
    return [llm.get_tokenizer().encode(p) for p in PROMPTS]


def check_mixed_batch(base: str, loras: list[LoRARequest], **kw) -> list[list[int]]:
    """Every prompt under every adapter and the base model, all in one batch, against transformers + peft;
    returns the engine's tokens (prompt-major, the base model first)."""
    choices = [None, *loras]
    with LLM(base, **KW, **kw) as llm:
        ids = prompt_ids(llm)
        batch = [(p, lr) for p in ids for lr in choices]
        outs = llm.generate([p for p, _ in batch], GREEDY, use_tqdm=False, lora_request=[lr for _, lr in batch])
        tokens = [o["token_ids"] for o in outs]
    refs = {}
    for (p, lr), got in zip(batch, tokens):
        ref = refs[(tuple(p), lr)] = peft_greedy(base, lr.lora_path if lr else None, p, 32)
        assert got == ref, f"adapter {lr.lora_name if lr else None}, prompt {p[:6]}..."
    for lr in loras:  # each adapter changes the base model's output on some prompt (the check is not vacuous)
        assert any(refs[(tuple(p), lr)] != refs[(tuple(p), None)] for p in ids), f"{lr.lora_name} changes nothing"
    return tokens


def test_qwen3_adapters_in_one_batch_match_peft(tiny_tied_model, qwen3_loras):
    """Three adapters (all seven modules r=8; attention only r=4 rsLoRA; MLP only r=16) and the base model,
    every prompt under each, in one batch on two slots: the scheduler holds back rows of the third adapter
    until a slot is idle, then loads it over the least recently used one."""
    check_mixed_batch(tiny_tied_model, qwen3_loras, max_loras=2)


def test_each_adapter_alone_equals_the_mixed_batch(tiny_tied_model, qwen3_loras):
    with LLM(tiny_tied_model, **KW, max_loras=3) as llm:
        ids = prompt_ids(llm)[:4]
        choices = [None, *qwen3_loras]
        mixed = llm.generate([p for p in ids for _ in choices], GREEDY, use_tqdm=False,
                             lora_request=[lr for _ in ids for lr in choices])
        for j, lr in enumerate(choices):
            alone = llm.generate(ids, GREEDY, use_tqdm=False, lora_request=lr)
            assert [o["token_ids"] for o in alone] == [mixed[i * len(choices) + j]["token_ids"]
                                                       for i in range(len(ids))]


def test_more_adapters_than_slots_and_host_cache_finish_correctly(tiny_tied_model, qwen3_loras):
    """One slot and one adapter in host memory for three adapters queued at once: each runs in its turn, the
    host LRU reloads from disk, and every output is still that adapter's."""
    with LLM(tiny_tied_model, **KW, max_loras=1, max_cpu_loras=1) as llm:
        ids = prompt_ids(llm)[:3]
        loras = [qwen3_loras[i % 3] for i in range(9)]
        outs = llm.generate([ids[i % 3] for i in range(9)], SamplingParams(temperature=0, max_tokens=8,
                                                                           ignore_eos=True),
                            use_tqdm=False, lora_request=loras)
        manager = llm.engine.executor.runner.lora
        assert len(manager.host) == 1
        llm.engine.scheduler.check_integrity()
    for i, o in enumerate(outs):
        assert o["token_ids"] == peft_greedy(tiny_tied_model, loras[i].lora_path, ids[i % 3], 32)[:8]


def test_chunked_prefill_and_preemption_keep_each_rows_adapter(tiny_tied_model, qwen3_loras):
    """A 16-token budget (prompts in chunks, prefill and decode rows of several adapters in one step) and a KV
    cache of a few blocks (preemptions, recompute): still every adapter's own tokens."""
    choices = [None, *qwen3_loras]
    with LLM(tiny_tied_model, **KW, max_loras=2, max_num_batched_tokens=16, num_kvcache_blocks=12,
             max_model_len=192) as llm:
        ids = prompt_ids(llm)
        batch = [(p, choices[i % 4]) for i, p in enumerate(ids)]
        outs = llm.generate([p for p, _ in batch], GREEDY, use_tqdm=False, lora_request=[lr for _, lr in batch])
        assert llm.engine.scheduler.num_preemptions > 0
    for (p, lr), o in zip(batch, outs):
        assert o["token_ids"] == peft_greedy(tiny_tied_model, lr.lora_path if lr else None, p, 32)


def test_prefix_cache_is_keyed_on_the_adapter(tiny_tied_model, qwen3_loras):
    """The same prompt under two adapters shares no KV block; under the same adapter it hits."""
    a, b = qwen3_loras[:2]
    with LLM(tiny_tied_model, **KW, max_loras=2) as llm:
        engine = llm.engine
        prompt = llm.get_tokenizer().encode("def shared_prefix(a, b, c):\n    " + "total = a + b + c\n    " * 6)
        assert len(prompt) > 3 * engine.config.cache_config.kvcache_block_size
        params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)

        def run(lr) -> tuple[list[int], int]:
            rid = engine.add_request(prompt, params, lora_request=lr)
            hits = 0
            while True:
                outs, stats = engine.step()
                hits += stats.prefix_cache_hit_tokens
                done = [o for o in outs if o.request_id == rid and o.finished]
                if done:
                    return done[0].outputs[0].token_ids, hits

        first, hits = run(a)
        assert hits == 0
        for lr, want_hit in ((b, False), (None, False), (a, True)):
            tokens, hits = run(lr)
            assert (hits > 0) == want_hit, f"adapter {lr.lora_name if lr else None}: {hits} hit tokens"
            assert tokens == peft_greedy(tiny_tied_model, lr.lora_path if lr else None, prompt, 32)[:4]
        engine.scheduler.check_integrity()


def test_add_remove_list_loras(tiny_tied_model, qwen3_loras):
    a, b, _ = qwen3_loras
    with LLM(tiny_tied_model, **KW) as llm:
        ids = [llm.get_tokenizer().encode("def shared_prefix(a, b, c):\n    " + "total = a + b + c\n    " * 4)]
        assert llm.list_loras() == set()
        assert llm.add_lora(a) and llm.add_lora(a)  # adding again is fine
        outs = llm.generate(ids, GREEDY, use_tqdm=False, lora_request=a)  # its blocks stay in the prefix cache
        assert [o["token_ids"] for o in outs] == [peft_greedy(tiny_tied_model, a.lora_path, p, 32) for p in ids]
        llm.generate("x", SamplingParams(max_tokens=2), use_tqdm=False, lora_request=b)  # added on first use
        assert llm.list_loras() == {1, 2}
        with pytest.raises(ValueError, match="lora_int_id 1 already names"):
            llm.add_lora(LoRARequest("other", 1, b.lora_path))
        assert llm.remove_lora(1) and not llm.remove_lora(1)
        assert llm.list_loras() == {2}
        reused = LoRARequest("other", 1, b.lora_path)
        llm.add_lora(reused)  # the id is free again: now adapter b's folder, neither a's slot nor its cached blocks
        outs = llm.generate(ids, GREEDY, use_tqdm=False, lora_request=reused)
        assert [o["token_ids"] for o in outs] == [peft_greedy(tiny_tied_model, b.lora_path, p, 32) for p in ids]


def test_async_engine_passes_lora_request_through(tiny_tied_model, qwen3_loras):
    """AsyncLLM (the server's EngineClient): a request's adapter, add/remove/list, and a bad adapter's
    ValueError reaching the caller."""
    a, b, _ = qwen3_loras
    prompt = [5, 6, 7, 8]

    async def main():
        llm = AsyncLLM.from_model(tiny_tied_model, **KW, max_loras=2)
        llm.start()
        await llm.wait_ready()
        try:
            assert await llm.add_lora(a) and await llm.list_loras() == {1}
            streams = [await llm.add_request(prompt, GREEDY, lora_request=lr) for lr in (a, b, None)]
            outs = []
            for rs in streams:
                async for out in rs:
                    last = out
                outs.append(last.outputs[0].token_ids)
            with pytest.raises(ValueError, match="lora_path is not a folder"):
                await llm.add_request(prompt, GREEDY, lora_request=LoRARequest("bad", 9, "/nowhere"))
            assert await llm.remove_lora(2) and await llm.list_loras() == {1}
            return outs
        finally:
            await llm.shutdown()

    outs = asyncio.run(main())
    assert outs == [peft_greedy(tiny_tied_model, lr.lora_path if lr else None, prompt, 32) for lr in (a, b, None)]


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral", "gemma3"])
def test_dense_families_match_peft(family, tmp_path_factory):
    base = str(build_dense_checkpoint(tmp_path_factory.mktemp(f"tiny-{family}"), family, seed=3))
    check_mixed_batch(base, make_adapters(base, tmp_path_factory, family), max_loras=3)


@pytest.mark.slow
def test_moe_attention_adapter_matches_peft(tiny_moe_model, tmp_path_factory):
    """Qwen3-MoE with an attention-only adapter (an expert MLP takes none)."""
    path = build_lora_adapter(tiny_moe_model, tmp_path_factory.mktemp("moe-lora"), ATTENTION, 8, 16, seed=5)
    lora = LoRARequest("moe", 1, str(path))
    with LLM(tiny_moe_model, **KW) as llm:
        ids = prompt_ids(llm)
        outs = llm.generate(ids, GREEDY, use_tqdm=False, lora_request=lora)
    for p, o in zip(ids, outs):
        assert o["token_ids"] == peft_greedy(tiny_moe_model, str(path), p, 32)


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["tied", "untied"])
def test_tp2_equals_tp1(shape, tiny_tied_model, tiny_untied_model, qwen3_loras, tmp_path_factory):
    """TP=2 over gloo: column layers keep their rows of B, row layers their columns of A (partial sums). The
    untied model has one KV head, which both ranks hold (its k and v slices of B are replicated too)."""
    base = tiny_tied_model if shape == "tied" else tiny_untied_model
    loras = qwen3_loras if shape == "tied" else make_adapters(base, tmp_path_factory, "untied")
    tp1 = check_mixed_batch(base, loras, max_loras=2)
    choices = [None, *loras]
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with LLM(base, **KW, max_loras=2, tensor_parallel_size=2) as llm:
            ids = prompt_ids(llm)
            outs = llm.generate([p for p in ids for _ in choices], GREEDY, use_tqdm=False,
                                lora_request=[lr for _ in ids for lr in choices])
    finally:
        torch.set_num_threads(prev)
    assert [o["token_ids"] for o in outs] == tp1


@pytest.mark.triton
def test_triton_ops_in_the_engine_group_tokens_once_a_step(tiny_tied_model, qwen3_loras, monkeypatch):
    """The LoRA layers on the Triton kernels (the CUDA path, here in the interpreter): the same tokens as the
    torch ops, and the step's tokens grouped by slot once a forward, not once per layer."""
    import minivllm.kernels.lora_segments as seg_module
    import minivllm.lora.layers as layers
    import minivllm.lora.ops as ops

    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    choices = [None, *qwen3_loras[:2]]
    with LLM(tiny_tied_model, **KW, max_loras=2) as llm:
        ids = prompt_ids(llm)[:3]
        batch = [(p, lr) for p in ids for lr in choices]
        want = llm.generate([p for p, _ in batch], params, use_tqdm=False, lora_request=[lr for _, lr in batch])
        calls = []
        real = seg_module.lora_segments
        monkeypatch.setattr(seg_module, "lora_segments", lambda *a: calls.append(a[0].shape[0]) or real(*a))
        monkeypatch.setattr(ops, "uses_triton", lambda device: True)
        monkeypatch.setattr(layers, "uses_triton", lambda device: True)
        got = llm.generate([p for p, _ in batch], params, use_tqdm=False, lora_request=[lr for _, lr in batch])
    assert [o["token_ids"] for o in got] == [o["token_ids"] for o in want]
    # 9 rows, 4 tokens each: one grouping per forward (a prefill step, then the decode steps), none per layer
    assert 4 <= len(calls) <= 8, calls
