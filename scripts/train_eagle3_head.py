"""Train an EAGLE-3 draft head for the demo model on the CPU, save it in the published format, and measure its
acceptance on held-out Python files.

The head (``minivllm.models.eagle3``: one Llama layer over ``fc`` of the target's residual streams entering three
layers) learns the target's next-token distribution on windows of the demo's training corpus (the Python
standard library, the demo's held-out packages excluded). The target runs on the fly with ``transformers``
(its hidden states and logits for each batch). Training-time test (EAGLE-3): the head is unrolled
``--ttt-steps`` steps on its own outputs; step ``j`` at index ``t`` reads the token at ``t + 1 + j`` and the
head's pre-norm output of step ``j - 1`` (the target's fused states at step 0), attends to step 0's keys at
``0..t`` and to its own earlier steps' keys at ``t`` (what drafting at position ``t + j`` sees in its KV cache),
and is scored against the target's distribution at ``t + 1 + j``, restricted to the draft vocabulary (the
``--draft-vocab-size`` tokens most frequent in the corpus). The embedding is the target's, frozen and not
shipped (the engine shares it).

Acceptance: the target greedily continues prompts cut from held-out files; at each speculative step the head
drafts k tokens greedily and the leading ones equal to the target's greedy tokens are accepted. The unrolled
forward drafts every position at once: the head's step ``j`` at ``t`` is fed the target's tokens, which are its
drafts as long as every earlier draft of that step was accepted. n-gram prompt lookup is measured on the same
sequences.

Typical use (about 13 minutes on two idle cores, stopped by ``--minutes`` when they are shared)::

    python scripts/train_eagle3_head.py --out models/minivllm-demo-py-eagle3
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # NOTE: scripts/ is not a package
from demo_model.corpus import encode_stream, load_corpus  # noqa: E402

from minivllm.models.eagle3 import Eagle3Config, Eagle3LlamaForCausalLM  # noqa: E402
from minivllm.models.eagle3_loader import load_eagle3_config, load_eagle3_weights, save_eagle3  # noqa: E402
from minivllm.spec_decode.ngram import NgramProposer  # noqa: E402

STEP_WEIGHT = 0.8  # step j's loss weighs STEP_WEIGHT ** j (EAGLE-3's)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default=str(ROOT / "models" / "minivllm-demo-py"))
    p.add_argument("--out", required=True)
    p.add_argument("--aux-layers", default="1,3,5", help="target layers whose input streams the head fuses")
    p.add_argument("--draft-vocab-size", type=int, default=2048)
    p.add_argument("--intermediate-size", type=int, default=512)
    p.add_argument("--ttt-steps", type=int, default=4, help="training-time-test unroll length")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup-steps", type=int, default=20)
    p.add_argument("--max-steps", type=int, default=1500)
    p.add_argument("--minutes", type=float, default=30.0, help="training time budget (0: none)")
    p.add_argument("--max-files", type=int, default=None, help="only the first files of the corpus (smoke runs)")
    p.add_argument("--eval-prompts", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--gen-len", type=int, default=128)
    p.add_argument("--max-k", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-only", action="store_true", help="measure the head already saved at --out again")
    return p.parse_args(argv)


def load_target(path: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(path)


@torch.no_grad()
def target_features(target, ids: torch.Tensor, layers: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """The target over ``ids`` [B, L]: its fused streams [B, L, 3 * hidden] and logits [B, L, vocab]."""
    out = target(ids, output_hidden_states=True)
    return torch.cat([out.hidden_states[i] for i in layers], dim=-1), out.logits.float()


def draft_vocabulary(stream: torch.Tensor, vocab: int, size: int, eos: int) -> torch.Tensor:
    """The ``size`` most frequent token ids of ``stream`` (eos always), increasing."""
    counts = torch.bincount(stream, minlength=vocab).double()
    counts[eos] = math.inf
    return counts.topk(size).indices.sort().values


def build_head(target, draft_ids: torch.Tensor, layers: tuple[int, ...], intermediate: int,
               seed: int) -> Eagle3LlamaForCausalLM:
    """A head with the target's shapes, embedding (frozen) and, as a start, its LM head rows and final norm."""
    tc = target.config
    cfg = Eagle3Config.from_dict({
        "architectures": ["LlamaForCausalLMEagle3"], "hidden_size": tc.hidden_size,
        "intermediate_size": intermediate, "num_attention_heads": tc.num_attention_heads,
        "num_key_value_heads": tc.num_key_value_heads, "head_dim": tc.head_dim, "num_hidden_layers": 1,
        "vocab_size": tc.vocab_size, "draft_vocab_size": len(draft_ids), "rms_norm_eps": tc.rms_norm_eps,
        "rope_theta": getattr(tc, "rope_theta", None) or tc.rope_parameters["rope_theta"],
        "max_position_embeddings": tc.max_position_embeddings, "torch_dtype": "float32",
        "target_hidden_size": tc.hidden_size,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(layers), "use_aux_hidden_state": True}})
    torch.manual_seed(seed)
    head = Eagle3LlamaForCausalLM(cfg).float()
    with torch.no_grad():
        for name, p in head.named_parameters():
            p.copy_(torch.ones_like(p) if name.endswith("norm.weight") else 0.02 * torch.randn_like(p))
            p.requires_grad_(name != "embed_tokens.weight")
        head.embed_tokens.weight.copy_(target.get_input_embeddings().weight)
        head.lm_head.weight.copy_(target.get_output_embeddings().weight[draft_ids])
        head.norm.weight.copy_(target.model.norm.weight)
        # start as the "logit lens" of the highest fused stream: fc passes it through, the layer adds little
        h = tc.hidden_size
        head.fc.weight.mul_(0.1)  # the streams are large: full-size noise would drown the pass-through
        head.fc.weight[:, 2 * h:] += torch.eye(h)
        head.midlayer.self_attn.o_proj.weight.mul_(0.1)
        head.midlayer.mlp.down_proj.weight.mul_(0.1)
        head.d2t.copy_(draft_ids - torch.arange(len(draft_ids)))
        head.t2d.zero_()
        head.t2d[draft_ids] = True
    return head


def ttt_forward(head: Eagle3LlamaForCausalLM, aux: torch.Tensor, ids: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """The head unrolled ``steps`` steps over windows ``ids`` [B, L] with the target's fused streams ``aux``
    [B, L, 3 * hidden] (see the module docstring); step j's draft logits [B, T, draft_vocab], T = L - steps,
    index t drafting the token at t + 2 + j."""
    a = head.config.arch
    nh, nkv, hd = a.num_attention_heads, a.num_key_value_heads, a.head_dim
    layer, attn = head.midlayer, head.midlayer.self_attn
    b, length = ids.shape
    t = length - steps
    hidden = head.combine_hidden_states(aux[:, :t])  # [B, T, hidden]
    causal = torch.ones(t, t, dtype=torch.bool).triu(1)
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    logits = []
    for j in range(steps):
        x, residual = layer.attention_input(head.embed_tokens(ids[:, 1 + j:1 + j + t]), hidden)  # [B, T, 2h], [B, T, h]
        q, k, v = attn.qkv_proj(x).split([nh * hd, nkv * hd, nkv * hd], dim=-1)
        positions = (torch.arange(t) + j).repeat(b)  # [B * T]: drafting step j sits j past its index
        q, k = attn.rotary_emb(positions, q.reshape(b * t, nh, hd), k.reshape(b * t, nkv, hd))
        q = q.view(b, t, nh, hd).transpose(1, 2)  # [B, heads, T, hd]
        keys.append(k.view(b, t, nkv, hd).transpose(1, 2).repeat_interleave(nh // nkv, 1))  # [B, heads, T, hd]
        values.append(v.view(b, t, nkv, hd).transpose(1, 2).repeat_interleave(nh // nkv, 1))
        scores = (q @ keys[0].transpose(-1, -2)).masked_fill(causal, float("-inf"))  # [B, heads, T, T]
        own = [(q * key).sum(-1, keepdim=True) for key in keys[1:]]  # each [B, heads, T, 1]: this index's steps
        probs = (torch.cat([scores, *own], dim=-1) * hd ** -0.5).softmax(-1)
        o = probs[..., :t] @ values[0]  # [B, heads, T, hd]
        for i, value in enumerate(values[1:]):
            o = o + probs[..., t + i:t + i + 1] * value
        y, residual = layer.after_attention(attn.o_proj(o.transpose(1, 2).reshape(b, t, nh * hd)), residual)
        normed, hidden = head.norm(y, residual)  # the pre-norm output feeds the next step
        logits.append(head.compute_logits(normed))
    return logits


def ttt_loss(logits: list[torch.Tensor], target_logits: torch.Tensor, draft_ids: torch.Tensor,
             t2d: torch.Tensor) -> tuple[torch.Tensor, list[float]]:
    """The weighted soft cross entropy of each step against the target's distribution over the draft vocabulary
    (positions whose target argmax lies outside it left out), and each step's top-1 agreement."""
    total, accs = 0.0, []
    t = logits[0].shape[1]
    for j, lg in enumerate(logits):
        tl = target_logits[:, 1 + j:1 + j + t]  # [B, T, vocab]
        mask = t2d[tl.argmax(-1)].float()  # [B, T]
        p = tl[..., draft_ids].softmax(-1)  # [B, T, draft_vocab]
        ce = -(p * lg.log_softmax(-1)).sum(-1)  # [B, T]
        total = total + STEP_WEIGHT ** j * (ce * mask).sum() / mask.sum().clamp_min(1)
        agree = (lg.argmax(-1) == p.argmax(-1)).float()
        accs.append(float((agree * mask).sum() / mask.sum().clamp_min(1)))
    return total, accs


def lr_at(step: int, args) -> float:
    if step < args.warmup_steps:
        return args.lr * (step + 1) / args.warmup_steps
    frac = (step - args.warmup_steps) / max(1, args.max_steps - args.warmup_steps)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


def train(head, target, stream: torch.Tensor, draft_ids: torch.Tensor, layers, args) -> dict:
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(args.seed)
    length = args.seq_len + args.ttt_steps
    log, start, step = [], time.time(), 0
    while step < args.max_steps and not (args.minutes and time.time() - start > 60 * args.minutes):
        starts = torch.randint(0, len(stream) - length, (args.batch_size,), generator=gen)
        ids = torch.stack([stream[s:s + length] for s in starts.tolist()])  # [B, L]
        aux, tlogits = target_features(target, ids, layers)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args)
        loss, accs = ttt_loss(ttt_forward(head, aux, ids, args.ttt_steps), tlogits, draft_ids, head.t2d)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        log.append({"step": step, "loss": round(loss.item(), 4), "top1_per_step": [round(a, 4) for a in accs],
                    "seconds": round(time.time() - start, 1)})
        if step % 10 == 0 or step == 1:
            print(f"step {step}: loss {loss.item():.3f}, top-1 agreement per step "
                  f"{' '.join(f'{a:.2f}' for a in accs)} ({time.time() - start:.0f} s)", flush=True)
    return {"steps": step, "seconds": round(time.time() - start, 1), "tokens_seen": step * args.batch_size
            * args.seq_len, "log": log}


def held_out_sequences(target, tokenizer, texts: list[str], args) -> list[torch.Tensor]:
    """Prompts of ``--prompt-len`` tokens cut from held-out files (evenly spaced files, a seeded offset each),
    each followed by the target's greedy continuation of ``--gen-len`` tokens (cut after an end of text)."""
    need = args.prompt_len + 1
    encoded = tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
    streams = [torch.tensor(e.ids) for e in encoded if len(e.ids) > need]
    pick = np.linspace(0, len(streams) - 1, min(args.eval_prompts, len(streams))).round().astype(int)
    gen = torch.Generator().manual_seed(args.seed + 1)
    prompts = []
    for i in pick:
        s = streams[i]
        off = int(torch.randint(0, len(s) - args.prompt_len, (1,), generator=gen))
        prompts.append(s[off:off + args.prompt_len])
    with torch.no_grad():
        batch = torch.stack(prompts)  # [prompts, prompt_len]
        out = target.generate(batch, attention_mask=torch.ones_like(batch), max_new_tokens=args.gen_len,
                              do_sample=False, pad_token_id=tokenizer.eos_token_id)
    seqs = []
    for row in out:
        tail = row[args.prompt_len:]
        ends = (tail == tokenizer.eos_token_id).nonzero()
        seqs.append(row[:args.prompt_len + (int(ends[0]) + 1 if len(ends) else len(tail))])
    return seqs


def _leading(hits: np.ndarray) -> int:
    """How many of ``hits`` are true before the first false."""
    return int(hits.argmin()) if not hits.all() else len(hits)


def _cycles(matches: np.ndarray, start: int, k: int) -> list[tuple[int, int]]:
    """``(accepted, drafted)`` of each speculative step: the target's newest token at ``start + 1``;
    ``matches[p, j]``: the j-th draft from position p equals the target's token."""
    out, p = [], start
    while p < len(matches):
        a = _leading(matches[p, :k])
        out.append((a, k))
        p += a + 1
    return out


@torch.no_grad()
def eagle_acceptance(head, target, seqs, layers, args) -> dict[int, list[tuple[int, int]]]:
    """Per k, the accepted drafts of every speculative step over the held-out sequences."""
    per_k: dict[int, list[tuple[int, int]]] = {k: [] for k in range(1, args.max_k + 1)}
    for s in seqs:
        ids = s[:-1][None]  # the last token has nothing after it to check
        aux, _ = target_features(target, ids, layers)
        logits = ttt_forward(head, aux, ids, args.max_k)
        t = logits[0].shape[1]
        drafts = torch.stack([head.draft_to_target(lg[0].argmax(-1)) for lg in logits], 1)  # [T, max_k]
        truth = torch.stack([s[2 + j:2 + j + t] for j in range(args.max_k)], 1)  # [T, max_k]
        matches = (drafts == truth).numpy()
        for k in per_k:
            per_k[k] += _cycles(matches, args.prompt_len - 1, k)
    return per_k


def ngram_acceptance(seqs, args, lookup=(2, 5)) -> dict[int, list[tuple[int, int]]]:
    """The same count for n-gram prompt lookup (``lookup``: min and max n-gram; it may draft fewer than k)."""
    per_k: dict[int, list[tuple[int, int]]] = {}
    for k in range(1, args.max_k + 1):
        proposer, steps = NgramProposer(k, *lookup), []
        for s in seqs:
            tokens = s.numpy().astype(np.int32)
            p = args.prompt_len - 1  # the target's newest token sits at p + 1
            while p + 1 + k < len(tokens):
                drafts, num = proposer.propose(tokens[None, :p + 2], np.asarray([p + 2], dtype=np.int32))
                d = drafts[0, :num[0]]
                a = _leading(d == tokens[p + 2:p + 2 + len(d)])
                steps.append((a, len(d)))
                p += a + 1
        per_k[k] = steps
    return per_k


def summarize(per_k: dict[int, list[tuple[int, int]]]) -> dict[int, dict]:
    """Acceptance rate (accepted / drafted tokens) and mean acceptance length (1 + accepted, per step) for each
    k (vLLM's definitions)."""
    out = {}
    for k, v in per_k.items():
        accepted, drafted = sum(a for a, _ in v), sum(d for _, d in v)
        out[k] = {"steps": len(v), "drafted": drafted, "accepted": accepted,
                  "acceptance_rate": round(accepted / max(1, drafted), 4),
                  "mean_acceptance_length": round(1 + accepted / max(1, len(v)), 4)}
    return out


def table(eagle: dict, ngram: dict) -> str:
    lines = ["| k | EAGLE-3 acceptance rate | EAGLE-3 mean acceptance length | n-gram acceptance rate | "
             "n-gram mean acceptance length |", "|---|---|---|---|---|"]
    for k in eagle:
        e, n = eagle[k], ngram[k]
        lines.append(f"| {k} | {e['acceptance_rate']:.3f} | {e['mean_acceptance_length']:.2f} | "
                     f"{n['acceptance_rate']:.3f} | {n['mean_acceptance_length']:.2f} |")
    return "\n".join(lines)


def model_card(args, argv: list[str], eval_args, result: dict) -> str:
    """The head's README: ``args`` / ``argv`` of its training run, ``eval_args`` of its evaluation."""
    tr, ev = result["training"], result["evaluation"]
    weights = Path(eval_args.out) / "model.safetensors"
    num_params = result.get("num_params") or sum(v.numel() for v in load_file(str(weights)).values()
                                                 if v.is_floating_point())
    folder_kb = weights.stat().st_size / 1024
    return f"""# minivllm-demo-py-eagle3

An EAGLE-3 draft head for [`minivllm-demo-py`](../minivllm-demo-py), trained on the CPU by
`scripts/train_eagle3_head.py` and stored in the published EAGLE-3 format (`LlamaForCausalLMEagle3`:
`fc`, `midlayer.*`, `norm`, `lm_head`, `d2t`, `t2d`; no `embed_tokens`: the target's embedding is shared).

## Use

```python
LLM("models/minivllm-demo-py", speculative_config={{"method": "eagle3", "num_speculative_tokens": 3,
                                                   "model": "models/minivllm-demo-py-eagle3"}})
```

## Shapes

One Llama decoder layer, hidden {result['hidden_size']}, {result['heads']} query / {result['kv_heads']} KV heads,
MLP {args.intermediate_size}; `fc` fuses the residual streams entering target layers {result['aux_layers']}
(`eagle_config.eagle_aux_hidden_state_layer_ids`); draft vocabulary of {args.draft_vocab_size} tokens (the most
frequent in the training corpus, covering {result['draft_vocab_coverage']:.1%} of its tokens). {num_params:,}
parameters shipped, stored in bfloat16 ({folder_kb:.0f} KB `model.safetensors`).

## Training

```
python scripts/train_eagle3_head.py {shlex.join(argv)}
```

* Data: windows of {args.seq_len} + {args.ttt_steps} tokens of the demo model's training corpus (the standard
  library of the Python running the script, {result['python']}, without the held-out packages `email`, `json`,
  `xml`), the target's hidden states and logits computed on the fly with `transformers`.
* Objective: soft cross entropy against the target's next-token distribution over the draft vocabulary,
  training-time test unrolled {args.ttt_steps} steps, step j weighted {STEP_WEIGHT}^j.
* AdamW (betas 0.9/0.95), peak lr {args.lr}, {args.warmup_steps} warmup steps then cosine, batch
  {args.batch_size} windows; {tr['steps']} steps, {tr['tokens_seen']:,} tokens, {tr['seconds']:.0f} s on
  {result['device']} ({args.threads} threads). Final loss {tr['log'][-1]['loss']}; top-1 agreement with the
  target per unrolled step at the last step: {tr['log'][-1]['top1_per_step']}.

## Acceptance on held-out Python

{ev['num_sequences']} prompts of {eval_args.prompt_len} tokens cut from the held-out files (`email/`, `json/`,
`xml/`), each continued greedily by the target for up to {eval_args.gen_len} tokens ({ev['generated_tokens']:,} generated
tokens in all); at each speculative step the head drafts k tokens greedily and the leading drafts equal to the
target's greedy tokens are accepted. n-gram: prompt lookup (`prompt_lookup_min` 2, `prompt_lookup_max` 5) over
the same sequences. Mean acceptance length = 1 + accepted drafts per step (tokens per target forward). Measured
on the shipped bfloat16 weights (run in float32) with `python scripts/train_eagle3_head.py
{shlex.join(ev['argv'])}`; add `--eval-only` to measure the shipped head again without training.

{table(ev['eagle3'], ev['ngram'])}
"""


def load_saved_head(path: Path, target) -> Eagle3LlamaForCausalLM:
    """The head saved at ``path`` (bfloat16 weights, as shipped) in float32, with the target's embedding."""
    head = Eagle3LlamaForCausalLM(load_eagle3_config(str(path))).float()
    if not load_eagle3_weights(head, str(path)):
        with torch.no_grad():
            head.embed_tokens.weight.copy_(target.get_input_embeddings().weight)
    return head.eval()


def evaluate(path: Path, target, tokenizer, held_texts: list[str], args) -> dict:
    """Acceptance of the head saved at ``path`` and of n-gram lookup on held-out sequences (printed too)."""
    head = load_saved_head(path, target)
    layers = head.config.aux_layers_for(target.config.num_hidden_layers)
    seqs = held_out_sequences(target, tokenizer, held_texts, args)
    eagle, ngram = summarize(eagle_acceptance(head, target, seqs, layers, args)), summarize(ngram_acceptance(seqs, args))
    print(table(eagle, ngram), flush=True)
    return {"num_sequences": len(seqs), "generated_tokens": sum(len(s) - args.prompt_len for s in seqs),
            "eagle3": eagle, "ngram": ngram}


def main(argv: list[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    out = Path(args.out)
    target, tokenizer = load_target(args.target)
    corpus = load_corpus(args.max_files)
    if not args.eval_only:
        layers = tuple(int(i) for i in args.aux_layers.split(","))
        stream = encode_stream(tokenizer, corpus.train_texts)
        vocab = target.config.vocab_size
        draft_ids = draft_vocabulary(stream, vocab, args.draft_vocab_size, tokenizer.eos_token_id)
        head = build_head(target, draft_ids, layers, args.intermediate_size, args.seed)
        print(f"training on {len(stream):,} tokens, draft vocabulary {len(draft_ids)} of {vocab}", flush=True)
        training = train(head, target, stream, draft_ids, layers, args)
        save_eagle3(head, str(out), dtype=torch.bfloat16)
        result = {
            "argv": argv, "hidden_size": head.config.arch.hidden_size,
            "heads": head.config.arch.num_attention_heads, "kv_heads": head.config.arch.num_key_value_heads,
            "aux_layers": list(layers), "draft_vocab_coverage": float(head.t2d[stream].float().mean()),
            "python": platform.python_version(), "device": f"CPU ({platform.machine()})", "training": training,
            "num_params": sum(p.numel() for n, p in head.named_parameters() if n != "embed_tokens.weight"),
        }
    else:
        result = json.loads((out / "train_log.json").read_text())
    # NOTE: measured on the saved (bfloat16) weights: what ships, and what --eval-only measures again
    result["evaluation"] = evaluate(out, target, tokenizer, corpus.held_texts, args)
    result["evaluation"]["argv"] = argv
    train_argv = result.get("argv", ["--out", args.out])
    (out / "README.md").write_text(model_card(parse_args(train_argv), train_argv, args, result))
    (out / "train_log.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
