"""Fine-tune a LoRA adapter of the demo model that writes Google-style docstrings (peft, on the CPU).

The training text is the demo corpus's documented functions with their docstrings rewritten in the Google style
(``demo_model/google_docstrings.py``: summary, ``Args:``, ``Returns:``); only what follows each signature is
learned. The evaluation continues the signatures of held-out functions (the ``email``, ``json`` and ``xml``
packages, never trained on) up to the docstring's opening quotes, greedily, with the adapter and without it
(the base model), and counts the docstrings whose Args section names every parameter.

    python scripts/train_demo_lora.py    # a few minutes on 2 CPU cores

It writes ``adapter_config.json`` and ``adapter_model.safetensors`` (peft's format) and ``train_log.json``
(losses, rates, samples) into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo_model.corpus import collect_files, read_texts, stdlib_root  # noqa: E402
from demo_model.finetune_batches import chat_batch  # noqa: E402
from demo_model.google_docstrings import (  # noqa: E402
    DocumentedFunction,
    docstring_of_completion,
    documented_functions,
    is_google_style,
)

TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# the prompt the adapter's README, docs/lora.md and the server test show, base model against adapter
DEMO_PROMPT = 'def read_config(path, encoding="utf-8"):\n    """'


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="models/minivllm-demo-py")
    p.add_argument("--out", default="models/minivllm-demo-py-lora-google-docstrings")
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--alpha", type=int, default=16)
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-len", type=int, default=192, help="training examples are cut to this many tokens")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--eval-prompts", type=int, default=100, help="held-out functions (with parameters) to continue")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def functions_of(files: list[Path]) -> list[DocumentedFunction]:
    """The documented functions of ``files``, in file order."""
    _, texts = read_texts(files)
    return [fn for text in texts for fn in documented_functions(text)]


def encode_example(tokenizer, fn: DocumentedFunction, max_len: int) -> tuple[list[int], list[int]]:
    """``(ids, labels)`` of the rewritten function: labels are -100 on the signature (only the docstring and
    body are learned), else the token itself."""
    text = fn.rewritten()
    enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
    ids = enc["input_ids"][:max_len]
    labels = [tok if start >= len(fn.header) else -100 for tok, (start, _) in zip(ids, enc["offset_mapping"])]
    return ids, labels


def evenly_spaced(items: list, count: int) -> list:
    """``count`` items spread evenly over ``items`` (all of them if there are fewer)."""
    if len(items) <= count:
        return list(items)
    return [items[i * len(items) // count] for i in range(count)]


@torch.no_grad()
def continue_prompt(model, tokenizer, prompt: str, max_new_tokens: int) -> str:
    """The greedy continuation of ``prompt`` (text after the prompt)."""
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids  # [1, T]
    out = model.generate(input_ids=ids, max_new_tokens=max_new_tokens, do_sample=False,
                         pad_token_id=tokenizer.pad_token_id)  # [1, T + new]
    return tokenizer.decode(out[0, ids.shape[1]:])


def evaluate(model, tokenizer, fns: list[DocumentedFunction], max_new_tokens: int) -> dict:
    """Continue each held-out function's prompt with the adapter and without it; the Google-style rates."""
    counts = {"base": 0, "adapter": 0}
    args_counts = {"base": 0, "adapter": 0}
    for fn in fns:
        for which in ("base", "adapter"):
            if which == "base":
                with model.disable_adapter():
                    completion = continue_prompt(model, tokenizer, fn.prompt, max_new_tokens)
            else:
                completion = continue_prompt(model, tokenizer, fn.prompt, max_new_tokens)
            counts[which] += is_google_style(fn, completion)
            args_counts[which] += "Args:" in docstring_of_completion(completion)
    n = len(fns)
    return {
        "prompts": n,
        "google_style_rate": {k: v / n for k, v in counts.items()},
        "args_section_rate": {k: v / n for k, v in args_counts.items()},
    }


def before_after(model, tokenizer, prompts: list[str], max_new_tokens: int) -> list[dict]:
    """Greedy continuations of each prompt by the base model and by the adapter."""
    samples = []
    for prompt in prompts:
        with model.disable_adapter():
            base = continue_prompt(model, tokenizer, prompt, max_new_tokens)
        samples.append({"prompt": prompt, "base": base,
                        "adapter": continue_prompt(model, tokenizer, prompt, max_new_tokens)})
    return samples


def train(model, examples, args, pad: int) -> list[dict]:
    """AdamW on the LoRA weights with a cosine schedule; returns the logged losses."""
    rng = random.Random(args.seed)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    model.train()
    history, t0 = [], time.perf_counter()
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = args.lr * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        x, y = chat_batch(examples, rng, args.batch_size, pad)  # [B, T], [B, T]
        logits = model(input_ids=x, use_cache=False).logits  # [B, T, V]
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if (step + 1) % 25 == 0 or step == 0 or step + 1 == args.steps:
            history.append({"step": step + 1, "loss": round(loss.item(), 4),
                            "seconds": round(time.perf_counter() - t0, 1)})
            print(f"step {step + 1}/{args.steps}  loss {loss.item():.3f}  {time.perf_counter() - t0:.0f} s",
                  flush=True)
    model.eval()
    return history


def main(argv=None) -> dict:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    args = parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    base = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    train_files, held_files = collect_files(stdlib_root())
    train_fns = functions_of(train_files)
    held_fns = evenly_spaced([fn for fn in functions_of(held_files) if fn.params], args.eval_prompts)
    examples = [encode_example(tokenizer, fn, args.max_len) for fn in train_fns]
    print(f"{len(examples)} training functions, {len(held_fns)} held-out prompts")

    lora = LoraConfig(r=args.rank, lora_alpha=args.alpha, lora_dropout=0.0, target_modules=list(TARGET_MODULES),
                      task_type="CAUSAL_LM")
    model = get_peft_model(base, lora)
    t0 = time.perf_counter()
    history = train(model, examples, args, tokenizer.pad_token_id)
    train_seconds = time.perf_counter() - t0
    rates = evaluate(model, tokenizer, held_fns, args.max_new_tokens)
    print(json.dumps(rates, indent=2))
    samples = before_after(model, tokenizer, [DEMO_PROMPT, *(fn.prompt for fn in held_fns[:3])],
                           args.max_new_tokens)
    for s in samples:
        print(f"--- prompt\n{s['prompt']}\n--- base\n{s['base']}\n--- adapter\n{s['adapter']}\n")

    out = Path(args.out)
    model.save_pretrained(out)
    log = {
        "args": vars(args), "training_functions": len(examples), "train_seconds": round(train_seconds, 1),
        "history": history, "eval": rates, "samples": samples,
        "versions": {"torch": torch.__version__, "peft": __import__("peft").__version__,
                     "transformers": __import__("transformers").__version__},
    }
    (out / "train_log.json").write_text(json.dumps(log, indent=2) + "\n")
    return log


if __name__ == "__main__":
    main()
