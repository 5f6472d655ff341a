"""Measure ``minivllm-demo-chat`` on held-out protocol prompts, through minivllm's ``LLM`` and its own parsers.

The prompts come from ``demo_model/protocol_data.py`` with ``held_out=True``: cities, countries, phrases and
words kept out of training, tool names built with verbs never used in training, and a seed of their own. Each
is answered greedily, with thinking on and off (as the example says), and read back with the qwen3 reasoning
parser and the hermes tool parser. Python prompts check that code completion did not pick up chat.

    python scripts/eval_demo_chat.py --model models/minivllm-demo-chat --n 200 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo_model.protocol_data import Example, Generator  # noqa: E402

CODE_PROMPTS = ("def fibonacci(n):", "import os\n", "class Stack:", "for i in range(", "def read_config(path):\n",
                "    return self.")
CHAT_LEAKS = ("<think>", "<tool_call>", "<|im_end|>", "The user", "The tool", "<|im_start|>")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="models/minivllm-demo-chat")
    p.add_argument("--n", type=int, default=200, help="held-out conversations (tool and short ones)")
    p.add_argument("--seed", type=int, default=12345)
    p.add_argument("--max-tokens", type=int, default=160)
    p.add_argument("--json", type=Path, help="write the metrics and some samples here")
    p.add_argument("--training-lists", action="store_true",
                   help="draw from the training parts of the lists instead (new conversations, seen words)")
    return p.parse_args(argv)


def held_out_examples(n: int, seed: int, held_out: bool = True) -> list[Example]:
    """``n`` first replies (tool calls, requests no tool serves, short questions) of conversations of a seed the
    fine-tune did not use, from the held-out parts of the lists (or the training parts)."""
    gen = Generator(seed, held_out=held_out)
    out: list[Example] = []
    while len(out) < n:
        out += [e for e in gen.tool_examples() if e.kind != "tool_result"] if len(out) % 2 else [gen.short_example()]
    return out[:n]


def score(example: Example, out: dict, reasoning_parser, tool_parser) -> dict:
    """What one reply did right, read with minivllm's parsers."""
    text = out["text"]
    reasoning, content = reasoning_parser.extract(text, thinking=None if example.thinking else False)
    row = {"kind": example.kind, "thinking": example.thinking, "tokens": len(out["token_ids"]),
           "stopped": out["finish_reason"] == "stop",
           "think_ok": (text.startswith("<think>\n") and "\n</think>\n\n" in text and bool(reasoning))
           if example.thinking else "<think>" not in text}
    content, calls = tool_parser.extract(content or "")
    if example.kind == "tool":
        want = json.loads(example.answer.split("\n")[1])
        names = [t["function"]["name"] for t in example.tools]
        got = calls[0] if calls else None
        args = json.loads(got.arguments) if got else None
        tool = next((t for t in example.tools if got and t["function"]["name"] == got.name), None)
        keys = set(tool["function"]["parameters"]["properties"]) if tool else set()
        row.update(call=got is not None, name_in_tools=bool(got and got.name in names),
                   right_tool=bool(got and got.name == want["name"]), keys_from_tool=bool(got and set(args) <= keys),
                   right_args=bool(got and args == want["arguments"]))
    elif example.kind == "no_tool":
        row["no_call"] = not calls
    else:
        row["answer_ok"] = (content or "").strip() == example.answer
        row["arithmetic"] = example.thought[:1].isdigit()
    return row


def summarize(rows: list[dict]) -> dict:
    """Rates per kind (and per thinking mode for the format)."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        groups[r["kind"]].append(r)
        groups[f"thinking={r['thinking']}"].append(r)
        if r.get("arithmetic"):
            groups["arithmetic"].append(r)
    summary = {}
    for name, rs in sorted(groups.items()):
        keys = [k for k in rs[0] if isinstance(rs[0][k], bool) and k not in ("thinking", "arithmetic")
                and all(k in r for r in rs)]
        summary[name] = {"n": len(rs), **{k: round(sum(r[k] for r in rs) / len(rs), 3) for k in keys},
                         "mean_tokens": round(sum(r["tokens"] for r in rs) / len(rs), 1),
                         "under_50_tokens": round(sum(r["tokens"] < 50 for r in rs) / len(rs), 3)}
    return summary


def main(argv=None) -> dict:
    from minivllm import LLM, SamplingParams
    from minivllm.entrypoints.openai.reasoning import Qwen3ReasoningParser
    from minivllm.entrypoints.openai.tool_parsers.hermes import HermesToolParser

    args = parse_args(argv)
    examples = held_out_examples(args.n, args.seed, held_out=not args.training_lists)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    rows, samples = [], []
    with LLM(args.model, device="cpu", max_model_len=2048) as llm:
        for ex in examples:
            out = llm.chat(ex.messages, params, use_tqdm=False, tools=ex.tools,
                           chat_template_kwargs={"enable_thinking": ex.thinking})[0]
            rows.append(score(ex, out, Qwen3ReasoningParser(), HermesToolParser()))
            if len(samples) < 12:
                samples.append({"request": ex.messages[-1]["content"], "kind": ex.kind, "thinking": ex.thinking,
                                "reply": out["text"]})
        code = llm.generate(list(CODE_PROMPTS), SamplingParams(temperature=0, max_tokens=48), use_tqdm=False)
    code_samples = [{"prompt": p, "completion": o["text"]} for p, o in zip(CODE_PROMPTS, code)]
    leaks = [s for s in code_samples if any(m in s["completion"] for m in CHAT_LEAKS)]
    result = {"model": args.model, "lists": "training" if args.training_lists else "held-out", "n": len(rows), "summary": summarize(rows), "code_leaks": len(leaks),
              "samples": samples, "code_samples": code_samples}
    print(json.dumps({k: result[k] for k in ("n", "summary", "code_leaks")}, indent=1))
    for s in samples + code_samples:
        print(json.dumps(s))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
