"""Saving the checkpoint, greedy samples, the loss plot and the model card."""

from __future__ import annotations

import json
import platform
from pathlib import Path

import torch

from demo_model.constants import PERIODIC_EVAL_WINDOWS, VOCAB_MULTIPLE
from demo_model.corpus import save_tokenizer


def save_checkpoint(model, tokenizer, out: Path) -> None:
    """Save the model in bf16 with its generation config and tokenizer.

    ``config.json`` additionally gets the legacy keys ``torch_dtype`` and ``rope_theta`` so that
    readers written for transformers 4.x find them.
    """
    from transformers import GenerationConfig

    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16)
    model.generation_config = GenerationConfig(
        bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(out)
    path = out / "config.json"
    cfg = json.loads(path.read_text())
    cfg["dtype"] = cfg["torch_dtype"] = "bfloat16"
    cfg["rope_theta"] = cfg.get("rope_parameters", {}).get("rope_theta", 10000.0)
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    save_tokenizer(tokenizer, out)


def load_checkpoint(out: Path, device: torch.device):
    """Reload the saved folder (bf16 on CUDA, upcast to float32 on the CPU) and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(out, dtype=dtype).to(device).eval()
    return model, AutoTokenizer.from_pretrained(out)


@torch.no_grad()
def greedy_samples(model, tokenizer, prompts, max_new_tokens: int, device: torch.device) -> list[dict]:
    """Greedy continuations of each prompt with transformers ``generate``."""
    samples = []
    for prompt in prompts:
        enc = tokenizer(prompt, return_tensors="pt").to(device)
        out = model.generate(
            **enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
        )
        new = out[0, enc["input_ids"].shape[1] :]
        samples.append({"prompt": prompt, "completion": tokenizer.decode(new), "new_tokens": len(new)})
    return samples


def plot_loss(history: list[dict], evals: list[dict], unigram: float, path: Path) -> None:
    """Train loss (and periodic held-out loss) against the step, with the unigram baseline."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    ax.plot([h["step"] for h in history], [h["loss"] for h in history], label="train loss")
    if evals:
        ax.plot(
            [e["step"] for e in evals],
            [e["heldout_loss"] for e in evals],
            "o-",
            ms=3,
            label=f"held-out loss ({PERIODIC_EVAL_WINDOWS} windows)",
        )
    ax.axhline(unigram, color="gray", ls="--", lw=1, label=f"unigram baseline ({unigram:.2f})")
    last = history[-1]
    per_epoch = round(last["step"] / last["epoch"]) if last["epoch"] else 0
    ax.set_xlabel(f"optimizer step (1 epoch = {per_epoch} steps)")
    ax.set_ylabel("cross entropy (nats/token)")
    ax.set_ylim(0, max([h["loss"] for h in history] + [e["heldout_loss"] for e in evals] + [unigram]) * 1.05)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("minivllm demo model: training on the Python stdlib")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def folder_mb(out: Path) -> float:
    """Total size of the files in ``out`` in MB (10^6 bytes)."""
    return sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) / 1e6


def device_name(device: torch.device) -> str:
    """Human-readable name of the training device."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def model_card(log: dict) -> str:
    """The README.md of the checkpoint folder."""
    d, m, t, e = log["data"], log["model"], log["training"], log["eval"]
    samples = "\n\n".join(
        f"Prompt `{s['prompt']!r}`:\n\n```python\n{s['prompt']}{s['completion']}\n```" for s in log["samples"]
    )
    held = ", ".join(f"`{p}/`" for p in d["held_out_packages"])
    best = min(t["periodic_evals"], key=lambda ev: ev["heldout_loss"])
    per_epoch = t["steps"] / t["epochs"]
    subset = (
        "" if log["args"]["max_files"] is None else f"the first (`--max-files {log['args']['max_files']}`) "
    )
    return f"""# minivllm-demo-py

A tiny Qwen3-architecture language model trained from scratch on the Python standard library's
source code, shipped with minivllm so that examples and GPU tests have a real model with peaked
logits and no download. It continues Python code; it is not an assistant (the ChatML template
exists so that chat code paths can be exercised, but the model never saw chat data).

## Data

* Source: every `*.py` file of the standard library of **Python {log["python_version_short"]}**
  (`{d["stdlib_root"]}`), sorted by path, excluding `site-packages`, `test`, `tests`, `idlelib`
  and `lib2to3` directories and empty files. Each file is followed by `<|endoftext|>`.
* Held out (never trained on, tokenizer included): {subset}files under {held} —
  {d["held_files"]} files, {d["held_tokens"]:,} tokens.
* Training: {d["train_files"]} files, {d["train_tokens"]:,} tokens.
* The stdlib differs slightly between Python versions; this checkpoint used
  `{log["python_version"]}`.

## Tokenizer

Byte-level BPE (`tokenizers`), {m["tokenizer_vocab"]} tokens including the special tokens
`<|endoftext|>` (eos and pad, id {m["eos_token_id"]}), `<|im_start|>`, `<|im_end|>`; no bos.
Chat template: ChatML (`<|im_start|>{{role}}\\n{{content}}<|im_end|>\\n`, generation prompt
`<|im_start|>assistant\\n`).

## Model

`Qwen3ForCausalLM`: {m["parameters"]:,} parameters ({m["non_embedding_parameters"]:,} outside
the tied embedding), hidden {m["hidden_size"]}, {m["layers"]} layers, {m["heads"]} query heads /
{m["kv_heads"]} KV heads (GQA), head_dim {m["head_dim"]}, MLP {m["intermediate_size"]}, RMSNorm
with q/k norms, RoPE theta 10000, max_position_embeddings 2048, tied input/output embeddings.
The model's vocab is **{m["model_vocab"]}** (tokenizer vocab rounded up to a multiple of
{VOCAB_MULTIPLE}); ids >= {m["tokenizer_vocab"]} are never produced by the tokenizer. Stored in bfloat16
(`model.safetensors`, {log["folder_mb"]:.1f} MB folder).

## Training

```
{log["command"]}
```

* Device: {t["device"]}; torch {log["torch_version"]}, transformers {log["transformers_version"]}.
* {t["steps"]:,} AdamW steps (betas 0.9/0.95, weight decay {t["weight_decay"]}, peak lr {t["lr"]},
  {t["warmup_steps"]} warmup steps then cosine to {t["min_lr_ratio"]}x), batch
  {t["batch_size"]} x {t["seq_len"]} tokens, {t["tokens_seen"]:,} tokens seen
  ({t["epochs"]:.1f} epochs), {t["seconds"]:.0f} s of training ({t["stop_reason"]}).
  Residual dropout {t["dropout"]} on attention/MLP outputs while training (not part of the
  model); bf16 autocast on CUDA, float32 on the CPU.
* Final train loss (mean of the last logging interval): {t["final_train_loss"]:.4f} nats/token.
  Held-out loss during training ({PERIODIC_EVAL_WINDOWS} windows, every {log["args"]["eval_every"]} steps): lowest
  {best["heldout_loss"]:.4f} at step {best["step"]} (epoch {best["step"] / per_epoch:.1f}), last {t["periodic_evals"][-1]["heldout_loss"]:.4f}.
* Determinism: tokenizer, initialisation, data order and dropout masks depend only on `--seed`
  and the stdlib files; on the CPU a run whose length is set by `--max-epochs`/`--max-steps` is
  bitwise reproducible. When the time budget sets the length, the step count depends on the
  device's speed; on CUDA, kernels are not bitwise deterministic (results agree closely, not
  bitwise).

## Evaluation

Mean next-token cross entropy of the saved bf16 checkpoint on {e["windows"]} evenly spaced
{t["seq_len"]}-token windows ({e["target_tokens"]:,} predicted tokens):

| | nats/token | top-1 accuracy | mean top-1 probability |
|---|---|---|---|
| held-out (`{", ".join(d["held_out_packages"])}`) | **{e["heldout_loss"]:.4f}** | {e["heldout_top1_acc"]:.3f} | {e["heldout_top1_prob"]:.3f} |
| training windows (same count) | {e["train_window_loss"]:.4f} | {e["train_window_top1_acc"]:.3f} | {e["train_window_top1_prob"]:.3f} |
| unigram baseline on the held-out tokens (add-one smoothed training counts, {e["unigram_vocab"]} symbols) | {e["unigram_baseline"]:.4f} | | |

![loss curve](loss_curve.png)

## Greedy samples (`max_new_tokens={log["sample_tokens"]}`)

{samples}

## License

The training text is the CPython standard library (PSF License).
"""


def summary_rows(log: dict) -> list[tuple[str, str]]:
    """Key figures for the final console table."""
    d, m, t, e = log["data"], log["model"], log["training"], log["eval"]
    best = min(t["periodic_evals"], key=lambda ev: ev["heldout_loss"])
    return [
        ("output", log["out"]),
        ("device", t["device"]),
        ("python (stdlib)", log["python_version_short"]),
        ("parameters", f"{m['parameters']:,} ({m['non_embedding_parameters']:,} non-embedding)"),
        ("vocab tokenizer / model", f"{m['tokenizer_vocab']} / {m['model_vocab']}"),
        ("train / held-out tokens", f"{d['train_tokens']:,} / {d['held_tokens']:,}"),
        ("steps / epochs", f"{t['steps']:,} / {t['epochs']:.2f}"),
        ("tokens seen", f"{t['tokens_seen']:,}"),
        ("training time", f"{t['seconds']:.1f} s ({t['stop_reason']})"),
        ("final train loss", f"{t['final_train_loss']:.4f}"),
        ("best periodic held-out", "{heldout_loss:.4f} at step {step}".format(**best)),
        ("train-window loss", f"{e['train_window_loss']:.4f}"),
        ("held-out loss", f"{e['heldout_loss']:.4f}"),
        ("held-out top-1 acc / prob", f"{e['heldout_top1_acc']:.3f} / {e['heldout_top1_prob']:.3f}"),
        ("unigram baseline", f"{e['unigram_baseline']:.4f}"),
        ("folder size", f"{log['folder_mb']:.1f} MB"),
        ("total wall time", f"{log['wall_seconds']:.1f} s"),
    ]


def print_summary(log: dict) -> None:
    """Print the summary table."""
    rows = summary_rows(log)
    width = max(len(k) for k, _ in rows)
    print("\n" + "=" * 72 + "\nSummary\n" + "=" * 72)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
