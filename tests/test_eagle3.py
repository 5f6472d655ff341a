"""The EAGLE-3 head (minivllm/models/eagle3.py): its forward against a plain reference, the published checkpoint
format (names, shapes, the d2t / t2d vocabulary maps) and the target's auxiliary hidden states."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from minivllm.config.hf import load_arch
from minivllm.models.eagle3 import Eagle3Config, Eagle3LlamaForCausalLM, default_aux_layers
from minivllm.models.eagle3_loader import (
    check_vocab_maps,
    eagle3_state_dict,
    load_eagle3_config,
    load_eagle3_weights,
    save_eagle3,
)
from minivllm.models.loader import load_weights
from minivllm.models.qwen3 import Qwen3ForCausalLM
from tests.helpers.eagle3_reference import (
    bind_head_cache,
    head_config,
    one_sequence_meta,
    random_head,
    reference_step,
)

BLOCK = 4


@pytest.mark.parametrize("norm_before_residual", [False, True])
@pytest.mark.parametrize("target_hidden", [None, 48])
def test_forward_matches_reference(norm_before_residual, target_hidden):
    """A prefill of 11 tokens, then two draft steps fed the head's own pre-norm output, each against a plain
    float64 reference over the whole sequence."""
    cfg = head_config(target_hidden=target_hidden, norm_before_residual=norm_before_residual)
    head = random_head(cfg, seed=3)
    sd = eagle3_state_dict(head, with_embedding=True)
    bind_head_cache(head, num_blocks=8, block_size=BLOCK)
    gen = torch.Generator().manual_seed(0)
    n = 11
    ids = torch.randint(0, cfg.arch.vocab_size, (n + 2,), generator=gen)
    aux = torch.randn(n, 3 * cfg.target_hidden_size, generator=gen)  # [n, 3 * target_hidden]
    with torch.inference_mode():
        hidden = head.combine_hidden_states(aux)  # [n, hidden]
        torch.testing.assert_close(hidden, aux @ sd["fc.weight"].T)
        normed, prenorm = head(ids[:n], torch.arange(n), hidden, one_sequence_meta(0, n, BLOCK, 8))
        hiddens = [hidden]
        for step in range(2):  # each draft step: the last token's pre-norm output is the next one's hidden
            hiddens.append(prenorm[-1:])
            pos = n + step
            normed_step, prenorm = head(ids[pos:pos + 1], torch.tensor([pos]), prenorm[-1:],
                                        one_sequence_meta(pos, 1, BLOCK, 8))
            ref_normed, ref_prenorm = reference_step(sd, cfg, ids[:pos + 1], torch.arange(pos + 1),
                                                     torch.cat(hiddens))
            torch.testing.assert_close(normed_step, ref_normed[-1:].float(), rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(prenorm, ref_prenorm[-1:].float(), rtol=1e-4, atol=1e-4)
    ref_normed, ref_prenorm = reference_step(sd, cfg, ids[:n], torch.arange(n), hidden)
    torch.testing.assert_close(normed, ref_normed.float(), rtol=1e-4, atol=1e-4)
    logits = head.compute_logits(normed)  # [n, draft_vocab]
    assert logits.shape == (n, cfg.draft_vocab_size)
    torch.testing.assert_close(logits, (ref_normed @ sd["lm_head.weight"].double().T).float(), rtol=1e-4,
                               atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_forward_low_precision_close_to_float32(dtype):
    """The head in half precision stays within that precision's tolerance of its float32 self."""
    cfg = head_config()
    head32 = random_head(cfg, seed=5)
    head = random_head(cfg, seed=5).to(dtype)
    gen = torch.Generator().manual_seed(1)
    n = 9
    ids = torch.randint(0, cfg.arch.vocab_size, (n,), generator=gen)
    hidden = torch.randn(n, cfg.arch.hidden_size, generator=gen)
    outs = []
    for h in (head32, head):
        bind_head_cache(h, 4, BLOCK)
        if h is head:  # the cache in the head's dtype
            for m in h.modules():
                if hasattr(m, "k_cache"):
                    m.k_cache, m.v_cache = m.k_cache.to(dtype), m.v_cache.to(dtype)
        with torch.inference_mode():
            outs.append(h(ids, torch.arange(n), hidden.to(h.fc.weight.dtype), one_sequence_meta(0, n, BLOCK, 4))[0])
    tol = {torch.float16: 2e-2, torch.bfloat16: 8e-2}[dtype]
    torch.testing.assert_close(outs[1].float(), outs[0], rtol=tol, atol=tol)


def test_save_load_round_trip(tmp_path):
    """save_eagle3 writes the published names; load_eagle3_config / load_eagle3_weights read them back."""
    cfg = head_config(aux_layers=(0, 1, 1))
    head = random_head(cfg, seed=1)
    save_eagle3(head, str(tmp_path), dtype=torch.float32)
    stored = load_file(str(tmp_path / "model.safetensors"))
    assert "midlayer.self_attn.q_proj.weight" in stored and "midlayer.mlp.gate_proj.weight" in stored
    assert "embed_tokens.weight" not in stored and stored["t2d"].dtype == torch.bool
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["LlamaForCausalLMEagle3"]
    cfg2 = load_eagle3_config(str(tmp_path))
    assert cfg2 == cfg and cfg2.aux_layers_for(2) == (0, 1, 1)
    head2 = Eagle3LlamaForCausalLM(cfg2).float()
    assert load_eagle3_weights(head2, str(tmp_path)) is False  # no embedding of its own: shares the target's
    for (name, p), (_, p2) in zip(head.named_parameters(), head2.named_parameters()):
        if name != "embed_tokens.weight":
            torch.testing.assert_close(p2, p, rtol=0, atol=0, msg=name)
    assert torch.equal(head2.d2t, head.d2t) and torch.equal(head2.t2d, head.t2d)


def test_loads_vllm_names_and_pytorch_bin(tmp_path):
    """A checkpoint stored with a ``model.`` prefix and ``layers.0.`` for ``midlayer.`` (as some converters do),
    as ``pytorch_model.bin``, with its own embedding."""
    cfg = head_config()
    head = random_head(cfg, seed=2)
    sd = {("model." + k.replace("midlayer.", "layers.0.")): v.clone()
          for k, v in eagle3_state_dict(head, with_embedding=True).items()}
    torch.save(sd, tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    head2 = Eagle3LlamaForCausalLM(load_eagle3_config(str(tmp_path))).float()
    assert load_eagle3_weights(head2, str(tmp_path)) is True
    for (name, p), (_, p2) in zip(head.named_parameters(), head2.named_parameters()):
        torch.testing.assert_close(p2, p, rtol=0, atol=0, msg=name)


def _saved(tmp_path, cfg: Eagle3Config, edit) -> str:
    head = random_head(cfg)
    sd = {k: v.clone() for k, v in eagle3_state_dict(head).items()}
    edit(sd)
    save_file(sd, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    return str(tmp_path)


@pytest.mark.parametrize("edit, message", [
    (lambda sd: sd.update({"fc.weight": torch.zeros(64, 64 * 2)}), "fc.weight has shape"),
    (lambda sd: sd.update({"midlayer.self_attn.q_proj.weight": torch.zeros(64, 64)}), "q_proj.weight has shape"),
    (lambda sd: sd.update({"lm_head.weight": torch.zeros(448, 64)}), "lm_head.weight has shape"),
    (lambda sd: sd.pop("midlayer.hidden_norm.weight"), "lacks midlayer.hidden_norm.weight"),
    (lambda sd: sd.update({"midlayer2.mlp.up_proj.weight": torch.zeros(96, 64)}), "unexpected tensors"),
    (lambda sd: sd.update({"d2t": sd["d2t"] + 1000}), "outside the target vocabulary"),
    (lambda sd: sd.update({"d2t": sd["d2t"] - sd["d2t"] + (5 - torch.arange(200))}), "same target id"),
    (lambda sd: sd.update({"t2d": torch.ones(448, dtype=torch.bool)}), "t2d does not mark"),
])  # fmt: skip
def test_loader_rejects_other_shapes(tmp_path, edit, message):
    path = _saved(tmp_path, head_config(), edit)
    head = Eagle3LlamaForCausalLM(load_eagle3_config(path))
    with pytest.raises(ValueError, match=message):
        load_eagle3_weights(head, path)


@pytest.mark.parametrize("change, message", [
    ({"architectures": ["LlamaForCausalLM"]}, "must name architectures"),
    ({"num_hidden_layers": 2}, "one decoder layer"),
    ({"draft_vocab_size": 5000}, "draft_vocab_size must be"),
    ({"eagle_config": {"use_aux_hidden_state": False}}, "EAGLE-1"),
    ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2]}}, "must name 3 layers"),
])  # fmt: skip
def test_config_rejects_other_formats(change, message):
    cfg = {**head_config().to_dict(), **change}
    with pytest.raises(ValueError, match=message):
        Eagle3Config.from_dict(cfg)


def test_aux_layers_checked_against_target():
    assert default_aux_layers(36) == (2, 18, 33) and default_aux_layers(6) == (2, 3, 3)
    assert default_aux_layers(2) == (1, 1, 0)
    with pytest.raises(ValueError, match="the target has 4"):
        head_config(aux_layers=(1, 2, 4)).aux_layers_for(4)


def test_vocab_maps():
    """draft id i -> target id i + d2t[i]; target_logits spreads the draft logits there, -inf elsewhere."""
    head = random_head(head_config(vocab=50, draft_vocab=7), seed=4)
    target_ids = torch.nonzero(head.t2d).flatten()  # the kept target ids, increasing
    assert torch.equal(head.draft_to_target(torch.arange(7)), target_ids)
    logits = torch.randn(3, 7)
    spread = head.target_logits(logits)  # [3, 50]
    assert torch.equal(spread[:, target_ids], logits)
    assert torch.isinf(spread[:, ~head.t2d]).all() and (spread[:, ~head.t2d] < 0).all()
    check_vocab_maps(head.d2t, head.t2d)
    torch.testing.assert_close(spread.softmax(-1)[:, target_ids], logits.softmax(-1), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("aux_layers", [(0, 1, 1), (1, 0, 1)])
def test_aux_hidden_states_match_transformers(tiny_tied_model, aux_layers):
    """The target's residual stream entering layer i equals transformers' ``hidden_states[i]``, and asking for
    it leaves the final hidden states unchanged."""
    from transformers import AutoModelForCausalLM

    arch = load_arch(tiny_tied_model)
    model = Qwen3ForCausalLM(arch, max_position=256).float()
    load_weights(model, tiny_tied_model)
    bind_head_cache(model, num_blocks=8, block_size=BLOCK)
    ids = torch.randint(0, 384, (13,), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        plain = model(ids, torch.arange(13), one_sequence_meta(0, 13, BLOCK, 8))
        final, aux = model(ids, torch.arange(13), one_sequence_meta(0, 13, BLOCK, 8), aux_layers)
        hf = AutoModelForCausalLM.from_pretrained(tiny_tied_model, dtype=torch.float32)
        ref = hf(ids[None], output_hidden_states=True).hidden_states
    h = arch.hidden_size
    assert aux.shape == (13, 3 * h)
    torch.testing.assert_close(final, plain, rtol=0, atol=0)
    for j, layer in enumerate(aux_layers):
        torch.testing.assert_close(aux[:, j * h:(j + 1) * h], ref[layer][0], rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="aux_layers"):
        model(ids, torch.arange(13), one_sequence_meta(0, 13, BLOCK, 8), (0, 1, 2))
