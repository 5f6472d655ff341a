"""Fine-tune the demo model on a little chat data, so that the README's chat example gets an answer.

The model was trained on the standard library's source code only. This teaches it the ChatML turn
``<|im_start|>user\\nWhat does `os.path.join` do?<|im_end|>\\n<|im_start|>assistant\\n`` answered by the
docstring's first paragraph (``demo_model/chat_data.py``), while half of each step's sequences stay code
windows of the original corpus so that it keeps continuing Python. ``<|im_end|>`` becomes an end-of-sequence
token of the generation config, so a chat answer stops there.

    python scripts/finetune_demo_chat.py --model models/minivllm-demo-py --steps 300    # ~10 min on 2 CPU cores

It overwrites the checkpoint in place and writes ``finetune_log.json`` beside it.
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
from demo_model.chat_data import encode_pairs, qa_pairs  # noqa: E402
from demo_model.corpus import collect_files, encode_stream, read_texts, stdlib_root  # noqa: E402
from demo_model.finetune_batches import chat_batch, code_batch  # noqa: E402
from demo_model.report import save_checkpoint  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="models/minivllm-demo-py")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--chat-batch", type=int, default=16, help="chat sequences per step")
    p.add_argument("--code-batch", type=int, default=16, help="code windows per step")
    p.add_argument("--seq-len", type=int, default=160)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv=None) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    args = parse_args(argv)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    out = Path(args.model)
    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    root = stdlib_root()
    train_files, _ = collect_files(root)
    pairs = qa_pairs(root, train_files)
    examples = encode_pairs(tokenizer, pairs, args.seq_len)
    _, texts = read_texts(train_files)
    code = encode_stream(tokenizer, texts)
    print(f"{len(pairs)} question/answer pairs ({len(examples)} fit {args.seq_len} tokens), {len(code):,} code tokens")

    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    model.train()
    history, t0 = [], time.perf_counter()
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = args.lr * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        losses = {}
        opt.zero_grad(set_to_none=True)
        for kind, (x, y) in (("chat", chat_batch(examples, rng, args.chat_batch, tokenizer.pad_token_id)),
                             ("code", code_batch(code, rng, args.code_batch, args.seq_len))):
            logits = model(input_ids=x, use_cache=False).logits  # [B, T, V]
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100)
            (loss / 2).backward()
            losses[kind] = loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        history.append({"step": step + 1, **losses})
        if (step + 1) % 25 == 0 or step == 0:
            print(f"step {step + 1}: chat loss {losses['chat']:.3f}, code loss {losses['code']:.3f} "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)

    model.eval()
    save_checkpoint(model, tokenizer, out)  # bf16, as the model was shipped
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    gen = json.loads((out / "generation_config.json").read_text())
    gen["eos_token_id"] = [tokenizer.eos_token_id, im_end]
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    log = {"stdlib": str(root), "python": sys.version.split()[0], "pairs": len(pairs), "examples": len(examples),
           "args": vars(args), "seconds": round(time.perf_counter() - t0, 1), "history": history[::25] + history[-1:]}
    (out / "finetune_log.json").write_text(json.dumps(log, indent=1) + "\n")
    return log


if __name__ == "__main__":
    main()
