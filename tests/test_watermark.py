"""The keyed Gumbel-max watermark (``--watermark-config``): its PRF, its sampling (the model's distribution,
a deterministic function of the key and the context), its detection, the untouched sampling without it, the
config's validation, and the engine end to end."""

from __future__ import annotations

import pytest
import torch

from minivllm.config import WatermarkConfig
from minivllm.config.sampling import SamplingConfig
from minivllm.sample.metadata import build_sampling_metadata
from minivllm.sample.sampler import Sampler
from minivllm.sample.watermark import (
    context_of,
    detect,
    gumbel_watermark_sample,
    is_repeated_context,
    keys_tensor,
    row_key,
    uniforms,
)
from minivllm.sampling_params import SamplingParams
from tests.helpers.server_utils import ROOT

V = 40
WM = WatermarkConfig(key=42)
DEMO = ROOT / "models" / "minivllm-demo-py"


def _meta(params, logits, outputs, watermark=WM, seed=0):
    return build_sampling_metadata(params, [()] * len(params), outputs, [], logits.device, logits.shape[1],
                                   generator=torch.Generator().manual_seed(seed), watermark=watermark)


# ------------------------------------------------------------------ the PRF and the noise


def test_uniforms_are_in_the_open_interval_deterministic_and_spread():
    keys = keys_tensor([row_key(42, (-1, -1, 5, 9)), row_key(43, (-1, -1, 5, 9)), 2**64 - 1, 0], "cpu")
    u = uniforms(keys, torch.arange(4096))  # [4, 4096] float64
    assert u.dtype == torch.float64 and (u > 0).all() and (u < 1).all()
    assert torch.equal(u, uniforms(keys, torch.arange(4096)))
    assert not torch.equal(u[0], u[1])  # another secret key, other noise
    # uniform: mean 1/2, variance 1/12, and each decile about a tenth
    assert abs(u.mean().item() - 0.5) < 0.01 and abs(u.var().item() - 1 / 12) < 0.005
    deciles = torch.histc(u.float(), bins=10, min=0, max=1) / u.numel()
    assert (deciles - 0.1).abs().max() < 0.01
    # the per-token form: u of [R, 1] chosen ids is the same as the matching column of the full row
    picks = torch.tensor([[3], [17], [4095], [0]])
    assert torch.equal(uniforms(keys, picks).squeeze(1), u.gather(1, picks).squeeze(1))


def test_row_keys_depend_on_the_key_and_every_context_token():
    base = row_key(42, (1, 2, 3, 4))
    assert base == row_key(42, (1, 2, 3, 4))
    others = {row_key(41, (1, 2, 3, 4)), row_key(42, (0, 2, 3, 4)), row_key(42, (1, 2, 3, 5)),
              row_key(42, (-1, 2, 3, 4))}
    assert base not in others and len(others) == 4
    assert 0 <= base < 2**64


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_gumbel_max_over_many_keys_draws_the_softmax(temperature):
    """Across contexts (keys), argmax(l + G) is a draw of softmax(l): the watermark keeps the distribution."""
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, float("-inf")]) / temperature
    n = 20000
    keys = keys_tensor([row_key(7, (i,)) for i in range(n)], "cpu")
    picks = gumbel_watermark_sample(logits.expand(n, -1), keys)
    freq = torch.bincount(picks, minlength=6).double() / n
    assert torch.allclose(freq, torch.softmax(logits.double(), 0), atol=0.015), freq
    assert freq[5] == 0  # a filtered token never comes


# ------------------------------------------------------------------ contexts and deduplication


def test_context_is_the_last_generated_tokens_padded_before_the_first():
    assert context_of([], 0, 4) == (-1, -1, -1, -1)
    assert context_of([8, 9], 2, 4) == (-1, -1, 8, 9)
    assert context_of([1, 2, 3, 4, 5, 6], 6, 4) == (3, 4, 5, 6)
    assert context_of([5, 6, 7, 8], 100, 4) == (5, 6, 7, 8)  # a tail of a longer output
    with pytest.raises(ValueError, match="last 4 generated tokens"):
        context_of([7, 8], 10, 4)


def test_a_repeated_context_is_found_within_the_history_only():
    out = [1, 2, 3, 9, 1, 2]  # the next token's context (1, 2) was generated token 2's (3)
    assert is_repeated_context(out, 6, 2, None)
    assert is_repeated_context(out, 6, 2, 4)
    assert not is_repeated_context(out, 6, 2, 3)  # position 2 is beyond the last 3
    assert not is_repeated_context([1, 2, 3, 9, 1, 4], 6, 2, None)
    assert not is_repeated_context([], 0, 4, None) and not is_repeated_context([5], 1, 4, None)
    # padded contexts: (-1, 5) occurs again after an output that starts over? no: the padding is only at the start
    assert not is_repeated_context([5, 5], 2, 2, None)
    assert is_repeated_context([5, 5, 5], 3, 2, None)  # (5, 5) was position 2's context
    # a tail: the tokens before output[0] are not known, so only the positions with a whole window compare
    assert is_repeated_context([7, 1, 2, 8, 1, 2], 50, 2, None)
    assert not is_repeated_context([1, 2, 8, 1, 2], 50, 3, None)


# ------------------------------------------------------------------ in the sampler


def test_without_a_watermark_sampling_is_unchanged():
    """The same rows and generator give the same tokens whether the engine has a watermark that no row uses
    (greedy, opted out) or none at all; random rows differ once watermarked."""
    logits = torch.randn(6, V, generator=torch.Generator().manual_seed(0)) * 2
    outputs = [[1, 2, 3, 4, 5]] * 6
    plain = [SamplingParams(temperature=0.0) if i % 3 == 0 else SamplingParams(temperature=0.8, top_k=20)
             for i in range(6)]
    opted_out = [SamplingParams(temperature=p.temperature, top_k=p.top_k, watermarking=False) for p in plain]
    for seed in range(5):
        ref = Sampler()(logits, _meta(plain, logits, outputs, watermark=None, seed=seed)).sampled_token_ids
        md = _meta(opted_out, logits, outputs, seed=seed)
        assert md.watermark_rows is None
        assert torch.equal(Sampler()(logits, md).sampled_token_ids, ref)
    md = _meta(plain, logits, outputs)
    assert md.watermark_rows.tolist() == [1, 2, 4, 5]  # the random rows; greedy rows stay greedy
    out = Sampler()(logits, md).sampled_token_ids
    assert torch.equal(out[::3], logits[::3].argmax(-1))


def test_a_watermarked_row_is_a_function_of_key_and_context():
    """argmax(l / T + G) with the noise of (key, context): the same whatever the generator, batch or seed;
    another key or context gives other noise."""
    logits = torch.randn(1, V, generator=torch.Generator().manual_seed(1))
    params = [SamplingParams(temperature=0.7, seed=5)]
    ctx = [3, 1, 4, 1, 5]
    expected = (logits[0].double() / 0.7 - torch.log(-torch.log(
        uniforms(keys_tensor([row_key(42, context_of(ctx, 5, 4))], "cpu"), torch.arange(V))[0]))).argmax()
    picks = {Sampler()(logits, _meta(params, logits, [ctx], seed=s)).sampled_token_ids.item() for s in range(8)}
    assert picks == {expected.item()}
    batch = torch.cat([torch.randn(3, V), logits])  # in a batch, as row 3
    out = Sampler()(batch, _meta([SamplingParams(temperature=1.0)] * 3 + params, batch, [[0]] * 3 + [ctx]))
    assert out.sampled_token_ids[3].item() == expected.item()
    # many contexts, two keys: the draws differ
    many = torch.zeros(64, V)
    ctxs = [[i, i + 1, i + 2, i + 3] for i in range(64)]
    a = Sampler()(many, _meta([SamplingParams()] * 64, many, ctxs)).sampled_token_ids
    b = Sampler()(many, _meta([SamplingParams()] * 64, many, ctxs, watermark=WatermarkConfig(key=43)))
    assert (a != b.sampled_token_ids).sum() > 32


def test_a_repeated_context_samples_without_the_watermark():
    logits = torch.zeros(2, V)
    md = _meta([SamplingParams()] * 2, logits, [[1, 2, 3, 4, 9, 1, 2, 3, 4], [1, 2, 3, 4, 9, 1, 2, 3, 5]])
    assert md.watermark_rows.tolist() == [1]
    md = _meta([SamplingParams()] * 2, logits, [[1, 2, 3, 4, 9, 1, 2, 3, 4]] * 2,
               watermark=WatermarkConfig(key=42, deduplicate_contexts="none"))
    assert md.watermark_rows.tolist() == [0, 1]


# ------------------------------------------------------------------ detection


def test_detection_of_watermarked_tokens_and_not_of_others():
    """Tokens drawn with the key (from a flat distribution, the hardest case) score far above Gamma(n, 1); with
    another key, or drawn without, they do not."""
    g = torch.Generator().manual_seed(0)
    tokens: list[int] = []
    flat = torch.zeros(1, 200)
    for n in range(120):
        key = keys_tensor([row_key(42, context_of(tokens, n, 4))], "cpu")
        tokens.append(gumbel_watermark_sample(flat, key).item())
    marked = detect(tokens, WM)
    assert marked.num_scored_tokens > 100 and marked.p_value < 1e-6, marked
    assert detect(tokens, WatermarkConfig(key=7)).p_value > 1e-3
    plain = torch.randint(0, 200, (120,), generator=g).tolist()
    assert detect(plain, WM).p_value > 1e-3
    assert detect([], WM).p_value == 1.0


# ------------------------------------------------------------------ the config


@pytest.mark.parametrize("value, match", [
    ('{"algorithm": "gumbel"}', "watermark_config needs key"),
    ('{"key": 1, "algorithm": "sbw"}', "algorithm must be one of"),
    ('{"key": -1}', r"key must be an integer in \[0, 2\*\*64\)"),
    ('{"key": 1, "colour": 2}', "unknown key.*colour"),
    ('{"key": 1, "context_width": 0}', "context_width must be >= 1"),
    ('{"key": 1, "deduplicate_contexts": "all"}', "deduplicate_contexts must be one of"),
    ("[1]", "must be a JSON object"),
    ("{key: 1}", "must be a JSON object"),
])
def test_a_bad_watermark_config_is_a_value_error_naming_it(value, match):
    with pytest.raises(ValueError, match=match):
        SamplingConfig(watermark_config=value)


def test_the_flag_takes_vllms_json():
    from minivllm.entrypoints.args import engine_kwargs, serve_parser

    args = serve_parser().parse_args(["m", "--watermark-config", '{"algorithm":"gumbel","key":42}'])
    config = SamplingConfig(**{k: v for k, v in engine_kwargs(args).items() if k == "watermark_config"})
    assert config.watermark_config == WatermarkConfig(key=42, algorithm="gumbel")


# ------------------------------------------------------------------ end to end


@pytest.mark.slow
def test_the_engines_random_outputs_carry_the_watermark():
    """The demo model through the engine: random outputs are detected with the key (deterministic without
    deduplication), greedy and opted-out ones are not watermarked."""
    from minivllm import LLM

    config = {"key": 42, "deduplicate_contexts": "none"}
    llm = LLM(str(DEMO), device="cpu", watermark_config=config)
    # prompts whose continuations are not memorized: the watermark shows where the model has a choice
    prompts = ["x = ", "# ", "import "]
    first = llm.generate(prompts, SamplingParams(temperature=1.0, max_tokens=48, ignore_eos=True), use_tqdm=False)
    again = llm.generate(prompts, SamplingParams(temperature=1.0, max_tokens=48, ignore_eos=True, seed=9),
                         use_tqdm=False)
    assert [o["token_ids"] for o in first] == [o["token_ids"] for o in again]  # the key decides, not the seed
    wm = WatermarkConfig(**config)
    scores = [detect(o["token_ids"], wm) for o in first]
    assert all(d.num_scored_tokens == 48 and d.p_value < 1e-3 for d in scores), scores
    greedy = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=16), use_tqdm=False)
    plain = LLM(str(DEMO), device="cpu").generate(prompts, SamplingParams(temperature=0.0, max_tokens=16),
                                                   use_tqdm=False)
    assert [o["token_ids"] for o in greedy] == [o["token_ids"] for o in plain]
    out = llm.generate(prompts, [SamplingParams(temperature=1.0, max_tokens=48, seed=i, watermarking=False)
                                 for i in range(3)], use_tqdm=False)
    assert out[0]["token_ids"] != first[0]["token_ids"]


@pytest.mark.slow
@pytest.mark.server
def test_the_servers_completions_carry_the_watermark(tmp_path):
    """Over HTTP with the openai client, as vLLM's flag: ``--watermark-config`` watermarks random completions,
    streamed or not (the key decides the tokens: the same text twice), and ``watermarking: false`` opts out."""
    from tests.helpers.server_utils import running_server

    flag = '{"algorithm": "gumbel", "key": 42, "deduplicate_contexts": "none"}'
    args = ["--device", "cpu", "--served-model-name", "demo", "--watermark-config", flag]
    with running_server(str(DEMO), args, tmp_path) as srv:
        kw = {"model": "demo", "prompt": "x = ", "max_tokens": 48, "temperature": 1.0,
              "extra_body": {"return_token_ids": True, "ignore_eos": True}}
        whole = srv.client.completions.create(**kw).choices[0]
        chunks = srv.client.completions.create(stream=True, **kw)
        streamed = [t for c in chunks for ch in c.choices for t in (ch.model_extra or {}).get("token_ids") or []]
        assert streamed == whole.token_ids
        wm = WatermarkConfig(key=42, deduplicate_contexts="none")
        assert detect(whole.token_ids, wm).p_value < 1e-3
        opt_out = {**kw["extra_body"], "watermarking": False, "seed": 3}
        plain = srv.client.completions.create(**{**kw, "extra_body": opt_out}).choices[0]
        assert plain.token_ids != whole.token_ids
