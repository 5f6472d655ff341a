"""The model-based proposers through the whole engine (CPU, float32): ``draft_model`` and ``eagle3`` are lossless.

Greedy outputs equal the non-speculative engine's token for token (on the demo model with its shipped EAGLE-3 head
and with itself as its draft, and on a tiny random Qwen3 with a random head, itself, or another random checkpoint
as its draft), with the features that read or end a sequence. A checkpoint drafting for itself has every greedy
draft accepted; every test asserts that drafts were proposed (and where they must be, accepted), so none passes
with speculation silently off.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.config.hf import load_arch
from minivllm.models.eagle3_loader import save_eagle3
from minivllm.models.loader import load_weights
from minivllm.models.qwen3 import Qwen3ForCausalLM
from minivllm.spec_decode.draft_steps import DraftKVCache
from minivllm.spec_decode.eagle import EagleProposer
from minivllm.spec_decode.proposer import ProposerInputs
from tests.helpers.checkpoints import build_checkpoint
from tests.helpers.eagle3_reference import bind_head_cache, head_config, one_sequence_meta, random_head
from tests.helpers.spec_decode_checks import (
    DEMO_MODEL,
    REPETITIVE_PROMPTS,
    assert_same_outputs,
    feature_params,
)

ROOT = Path(__file__).resolve().parents[1]
DEMO_HEAD = str(ROOT / "models" / "minivllm-demo-py-eagle3")
GREEDY_64 = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny_head(tmp_path_factory, tiny_tied_model) -> str:
    """A random EAGLE-3 head for the tiny tied checkpoint (hidden 64, vocabulary 448, a draft vocabulary of 300)."""
    path = tmp_path_factory.mktemp("tiny-eagle3")
    save_eagle3(random_head(head_config(hidden=64, vocab=448, draft_vocab=300), seed=0), str(path),
                dtype=torch.float32)
    return str(path)


@pytest.fixture(scope="module")
def other_tiny_model(tmp_path_factory) -> str:
    """Another random checkpoint of the tiny tokenizer and vocabulary (a draft that disagrees)."""
    return str(build_checkpoint(tmp_path_factory.mktemp("tiny-other"), "untied", seed=7))


def spec(method: str, model: str, k: int = 3, **kw) -> dict:
    return {"method": method, "model": model, "num_speculative_tokens": k, **kw}


def assert_same_tokens(got: list[dict], expected: list[dict]) -> None:
    """``assert_same_outputs``, with prompt logprobs too compared within 1e-4 (rows meet in other batches when
    drafts change the steps, so float32 logits differ in their last bits)."""
    assert_same_outputs([{k: v for k, v in o.items() if k != "prompt_logprobs"} for o in got],
                        [{k: v for k, v in o.items() if k != "prompt_logprobs"} for o in expected])
    for g, e in zip(got, expected):
        for a, b in zip(g.get("prompt_logprobs") or [], e.get("prompt_logprobs") or [], strict=True):
            assert (a is None) == (b is None)
            if a is not None:
                assert a.keys() == b.keys() and all(abs(a[t].logprob - b[t].logprob) < 1e-4 for t in a)


def run_both(path: str, speculative_config: dict, prompts, params, **kw):
    """(speculative outputs, plain outputs, the speculative engine's counters)."""
    expected = LLM(path, device="cpu", **kw).generate(prompts, params, use_tqdm=False)
    llm = LLM(path, device="cpu", speculative_config=speculative_config, **kw)
    got = llm.generate(prompts, params, use_tqdm=False)
    llm.engine.scheduler.check_integrity()
    return got, expected, llm.engine.spec_totals


@pytest.mark.parametrize("draft", ["self", "other", "eagle3"])
def test_tiny_greedy_outputs_equal_no_speculation(draft, tiny_tied_model, other_tiny_model, tiny_head):
    """17 prompts x 64 tokens; the checkpoint as its own draft has every draft accepted."""
    config = {"self": spec("draft_model", tiny_tied_model), "other": spec("draft_model", other_tiny_model),
              "eagle3": spec("eagle3", tiny_head)}[draft]
    got, expected, totals = run_both(tiny_tied_model, config, REPETITIVE_PROMPTS, GREEDY_64)
    assert len(REPETITIVE_PROMPTS) >= 16
    assert [o["token_ids"] for o in got] == [o["token_ids"] for o in expected]
    assert totals.num_draft_tokens > 0 and sum(totals.per_pos) == totals.num_accepted_tokens
    if draft == "self":
        assert totals.num_accepted_tokens == totals.num_draft_tokens
        assert totals.mean_acceptance_length > 3.5


@pytest.mark.slow
def test_demo_as_its_own_draft_accepts_every_draft():
    got, expected, totals = run_both(DEMO_MODEL, spec("draft_model", DEMO_MODEL, k=4), REPETITIVE_PROMPTS,
                                     GREEDY_64)
    assert [o["token_ids"] for o in got] == [o["token_ids"] for o in expected]
    assert totals.num_draft_tokens > 0 and totals.num_accepted_tokens == totals.num_draft_tokens


@pytest.mark.slow
def test_demo_eagle3_head_greedy_equals_no_speculation():
    """The shipped head on the demo model: lossless, and it drafts tokens the target accepts."""
    got, expected, totals = run_both(DEMO_MODEL, spec("eagle3", DEMO_HEAD, k=3), REPETITIVE_PROMPTS, GREEDY_64)
    assert [o["token_ids"] for o in got] == [o["token_ids"] for o in expected]
    assert totals.num_accepted_tokens > 0 and totals.mean_acceptance_length > 1.0


@pytest.mark.slow
@pytest.mark.parametrize("method", ["draft_model", "eagle3"])
@pytest.mark.parametrize("kw", [
    dict(max_model_len=160),
    dict(max_model_len=160, num_kvcache_blocks=12),  # preemption
    dict(max_model_len=160, max_num_batched_tokens=16, num_kvcache_blocks=14),  # chunked prefill, tight budget
    dict(max_model_len=160, async_scheduling=True),
], ids=["plain", "preemption", "chunked", "async"])  # fmt: skip
def test_every_feature_equals_no_speculation(method, kw):
    """Stop ids and strings, penalties, logprobs, n > 1, min_tokens, max_model_len, logit bias and bad words (the
    greedy ones of ``feature_params``), under preemption, chunked prefill and asynchronous scheduling.

    NOTE: the seeded random ones are left out: with speculation on (n-gram too) a seeded request alone already
    draws other tokens than without, from its first token, in the engine these proposers plug into."""
    base = LLM(DEMO_MODEL, device="cpu", **kw)
    pairs = [(p, prompt) for p, prompt in zip(feature_params(base), REPETITIVE_PROMPTS) if p.temperature == 0]
    params, prompts = [p for p, _ in pairs], [prompt for _, prompt in pairs]
    expected = base.generate(prompts, params, use_tqdm=False)
    model = DEMO_MODEL if method == "draft_model" else DEMO_HEAD
    llm = LLM(DEMO_MODEL, device="cpu", speculative_config=spec(method, model), **kw)
    got = llm.generate(prompts, params, use_tqdm=False)
    assert_same_tokens(got, expected)
    assert llm.engine.spec_totals.num_accepted_tokens > 0
    llm.engine.scheduler.check_integrity()


@pytest.mark.parametrize("method", ["draft_model", "eagle3"])
def test_prefix_cache_hits_equal_no_speculation(method, tiny_tied_model, tiny_head):
    """The proposer's cache follows the target's blocks: a prompt whose blocks hit the prefix cache drafts from
    what the first request computed into them."""
    config = spec(method, tiny_tied_model if method == "draft_model" else tiny_head)
    prompts = REPETITIVE_PROMPTS[:6]
    expected = LLM(tiny_tied_model, device="cpu").generate(prompts, GREEDY_64, use_tqdm=False)
    llm = LLM(tiny_tied_model, device="cpu", speculative_config=config)
    first = llm.generate(prompts, GREEDY_64, use_tqdm=False)
    accepted = llm.engine.spec_totals.num_accepted_tokens
    again = llm.generate(prompts, GREEDY_64, use_tqdm=False)
    assert llm.engine.block_manager.num_cached_blocks > 0
    for out in (first, again):
        assert [o["token_ids"] for o in out] == [o["token_ids"] for o in expected]
    if method == "draft_model":  # its own draft: the second pass, over cached blocks, accepts every draft too
        t = llm.engine.spec_totals
        assert t.num_accepted_tokens == t.num_draft_tokens > accepted


def test_bad_model_configs_are_value_errors(tiny_tied_model, tiny_head, other_tiny_model, tmp_path):
    with pytest.raises(ValueError, match="EAGLE-1"):
        LLM(tiny_tied_model, device="cpu", speculative_config=spec("eagle", tiny_head))
    with pytest.raises(ValueError, match="for a target of vocab_size 448"):  # a head for another target
        LLM(DEMO_MODEL, device="cpu", speculative_config=spec("eagle3", tiny_head))
    with pytest.raises(ValueError, match="share the target's tokenizer"):
        LLM(DEMO_MODEL, device="cpu", speculative_config=spec("draft_model", other_tiny_model))
    with pytest.raises(ValueError, match="draft_tensor_parallel_size must be 1"):
        LLM(tiny_tied_model, device="cpu", speculative_config=spec("draft_model", tiny_tied_model,
                                                                   draft_tensor_parallel_size=2))
    with pytest.raises(ValueError, match="speculative_config.model .*no config.json"):
        LLM(tiny_tied_model, device="cpu", speculative_config=spec("eagle3", str(tmp_path)))


def test_ahead_tables_redirect_draft_positions_to_scratch():
    """Positions from ``first`` on go to the row's scratch blocks; the real block holding ``first`` is copied
    into the first of them (its earlier positions are accepted tokens the drafts attend to)."""
    layer = random_head(head_config()).midlayer.self_attn.attn
    kv = DraftKVCache([layer], num_blocks=10, block_size=4, k=5, max_rows=3, dtype=torch.float32,
                      device=torch.device("cpu"))
    kv.cache.copy_(torch.arange(kv.cache.shape[2], dtype=torch.float32).view(1, 1, -1, 1, 1, 1).expand_as(kv.cache))
    tables = np.array([[3, 7, -1], [5, -1, -1]], dtype=np.int32)
    out = kv.ahead_tables(tables, np.array([6, 4]))  # row 0: inside block 1 (id 7); row 1: at block 1's start
    s = kv.scratch
    assert s == 3 and out.shape == (2, 1 + s)
    assert out[0].tolist() == [3, 10, 11, 12] and out[1].tolist() == [5, 13, 14, 15]
    assert (kv.cache[:, :, 10] == 7).all() and (kv.cache[:, :, 13] == 13).all()  # only row 0's block is copied
    meta = kv.draft_step_meta(out, np.array([6, 4]))
    assert meta.slot_mapping.tolist() == [10 * 4 + 2, 13 * 4] and meta.context_lens.tolist() == [7, 5]


def _load_training_script():
    path = ROOT / "scripts" / "train_eagle3_head.py"
    spec_ = importlib.util.spec_from_file_location("train_eagle3_head", path)
    module = importlib.util.module_from_spec(spec_)
    sys.modules[spec_.name] = module
    spec_.loader.exec_module(module)
    return module


def test_proposer_drafts_equal_the_training_scripts_unrolled_head(tiny_tied_model, tiny_head):
    """The engine's paged drafting (catch-up, then drafts in scratch blocks) is what the training script's
    unrolled forward computes, so its acceptance figures are the engine's: the k drafts after a prefill equal
    the unrolled head's argmaxes when it is fed those drafts."""
    script = _load_training_script()
    target = Qwen3ForCausalLM(load_arch(tiny_tied_model), max_position=256).float()
    load_weights(target, tiny_tied_model)
    k, n, bs = 4, 13, 4
    proposer = EagleProposer(tiny_head, k, target, 256, torch.device("cpu"), torch.float32)
    proposer.init_kv_cache(num_blocks=8, block_size=bs, max_num_seqs=2, dtype=torch.float32)
    seq = torch.randint(0, 384, (n + 1,), generator=torch.Generator().manual_seed(3))  # prompt + sampled token
    bind_head_cache(target, num_blocks=8, block_size=bs)
    with torch.inference_mode():
        _, aux = target(seq[:n], torch.arange(n), one_sequence_meta(0, n, bs, 8), proposer.hidden_state_layers)
    history = np.zeros((1, 64), dtype=np.int32)
    history[0, :n + 1] = seq.numpy()
    inputs = ProposerInputs(
        seq_ids=(0,), slots=np.array([0]), token_ids=history, num_tokens=np.array([n + 1], dtype=np.int32),
        num_accepted=np.zeros(1, dtype=np.int32), next_token_ids=seq[n:].numpy(),
        max_drafts=np.array([k], dtype=np.int32), input_ids=seq[:n], positions=torch.arange(n),
        slot_mapping=torch.arange(n), cu_seqlens_q=np.array([0, n], dtype=np.int32),
        block_tables=np.arange(4, dtype=np.int32)[None], hidden_states=aux)
    proposal = proposer.propose(inputs)
    drafts = proposal.token_ids[0].tolist()
    assert proposal.num_drafts.tolist() == [k] and proposal.probs is None
    ids = torch.cat([seq, torch.tensor(drafts[:-1])])[None]  # [1, n + k]: fed its own drafts
    full_aux = torch.cat([aux, aux.new_zeros(k, aux.shape[1])])[None]  # positions past n are never read
    with torch.inference_mode():
        logits = script.ttt_forward(proposer.head, full_aux, ids, k)
    unrolled = [int(proposer.head.draft_to_target(lg[0, n - 1].argmax())) for lg in logits]
    assert drafts == unrolled


@pytest.mark.slow
@pytest.mark.parametrize("method", ["draft_model", "eagle3"])
def test_structured_outputs_stay_valid_and_equal(method):
    """Rows under a grammar with a model proposer: the greedy outputs equal those without speculation, each
    matches its grammar, and drafts were accepted."""
    from minivllm import StructuredOutputsParams

    regex = r"(def [a-z_]+\(\):\n    return [0-9]+\n){2}"
    repeat = r"(x = [0-9]\n){6}"
    so = StructuredOutputsParams
    params = [SamplingParams(temperature=0, max_tokens=60, structured_outputs=so(regex=regex)), GREEDY_64,
              SamplingParams(temperature=0, max_tokens=60, structured_outputs=so(regex=repeat)),
              SamplingParams(temperature=0, max_tokens=40, structured_outputs=so(choice=["yes", "no"]))]
    config = spec("draft_model", DEMO_MODEL, k=3) if method == "draft_model" else spec("eagle3", DEMO_HEAD, k=3)
    got, expected, totals = run_both(DEMO_MODEL, config, REPETITIVE_PROMPTS[:4], params)
    assert [o["token_ids"] for o in got] == [o["token_ids"] for o in expected]
    assert re.fullmatch(regex, got[0]["text"]) and re.fullmatch(repeat, got[2]["text"])
    assert got[3]["text"] in ("yes", "no")
    assert totals.num_accepted_tokens > 0
