"""Synthetic conversations in Qwen3's chat protocol, generated from this module's own lists.

Four kinds of example, each a conversation, the tools it offers (or none), whether thinking is on, and the reply
to learn:

* ``tool``: tools in the system turn and a request that one of them serves; the reply is one ``<tool_call>``
  block per call (``{"name": ..., "arguments": {...}}``) with the tool's name and parameter names copied from
  the tools list (both drawn at random per example from synonym lists, so they cannot be memorised) and the
  argument values taken from the request (a city, a unit, a number of days...);
* ``tool_result``: the same after the call and its ``<tool_response>``: a one-sentence answer from the result;
* ``no_tool``: tools offered but a request none of them serves (a short question): answered directly;
* ``short``: short questions with short answers: small arithmetic (answered with the number, or as a JSON
  object when asked), comparisons, capitals, greetings, "repeat this".

With thinking on (Qwen3's default) the reply opens with ``<think>\\n`` a sentence or two ``\\n</think>\\n\\n``;
with thinking off the prompt already ends with the empty think block and the reply is the answer alone.
``held_out=True`` draws from the parts of the lists kept out of training (every fifth city, country, word...,
and other verbs for tool names), for the evaluation.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from demo_model.tool_domains import DOMAINS
from demo_model.word_lists import CAPITALS, ECHO_WORDS, EMOJIS, GREETINGS, split


@dataclass(frozen=True)
class Example:
    """One conversation to learn a reply to."""

    kind: str
    messages: list
    tools: list | None
    thinking: bool
    thought: str
    answer: str


def arithmetic(rng: random.Random) -> tuple[str, int, str]:
    """(expression, value, a one-line working) of small arithmetic."""
    op = rng.choice("++-*")
    if op == "*":
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        return f"{a} * {b}", a * b, f"{a} times {b} is {a * b}."
    a, b = rng.randint(0, 12), rng.randint(0, 12)
    if op == "-":
        a, b = max(a, b), min(a, b)
        return f"{a} - {b}", a - b, f"{a} minus {b} is {a - b}."
    return f"{a} + {b}", a + b, f"{a} plus {b} is {a + b}."


class Generator:
    """Draws examples of every kind from a seeded ``random.Random``."""

    def __init__(self, seed: int, held_out: bool = False):
        self.rng = random.Random(seed)
        self.held_out = held_out

    def pick(self, items):
        return self.rng.choice(split(items, self.held_out))

    # ---- short questions -------------------------------------------------------------------------------------
    def short(self) -> tuple[str, str, str]:
        """(question, thought, answer)."""
        r = self.rng
        kind = r.choices(["math", "math_json", "compare", "capital", "greet", "echo"], [5, 2, 2, 2, 1, 2])[0]
        if kind in ("math", "math_json"):
            expr, value, working = arithmetic(r)
            spaced = expr if r.random() < 0.5 else expr.replace(" ", "")
            q = r.choice(["What is {e}?", "what is {e}?", "Compute {e}.", "{e} = ?", "How much is {e}?",
                          "Calculate {e}.", "What's {e}? Be brief."]).format(e=spaced)
            if kind == "math_json":
                key = r.choice(["answer", "value", "result", "total", "sum", "n"])
                q += r.choice([f" Answer as a JSON object with the key \"{key}\".",
                               f" Reply in JSON, like {{\"{key}\": ...}}.",
                               f" Respond with JSON: {{\"{key}\": <number>}}"])
                return q, f"{working} The user wants JSON with the key {key}.", json.dumps({key: value})
            if r.random() < 0.3:
                q += r.choice([" Only the number, please.", " Just give the result.", " Answer briefly."])
            return q, working, str(value)
        if kind == "compare":
            a, b = r.sample(range(0, 100), 2)
            big = r.random() < 0.5
            q = r.choice(["Which is {w}, {a} or {b}?", "Which number is {w}: {a} or {b}?",
                          "{a} or {b}: which is {w}?"]).format(w="larger" if big else "smaller", a=a, b=b)
            ans = max(a, b) if big else min(a, b)
            return q, f"Comparing {a} and {b}, the {'larger' if big else 'smaller'} one is {ans}.", str(ans)
        if kind == "capital":
            country, capital = self.pick(CAPITALS)
            q = r.choice(["What is the capital of {c}?", "Capital of {c}?", "Which city is the capital of {c}?"])
            return q.format(c=country), f"The capital of {country} is {capital}.", f"{capital}."
        if kind == "greet":
            q, a = r.choice(GREETINGS)
            return q, "The user greets me. I reply politely and briefly.", a
        words = " ".join(r.choice(split(ECHO_WORDS, self.held_out)) for _ in range(r.randint(1, 5)))
        if r.random() < 0.4:
            words += " " + r.choice(EMOJIS)
        q = r.choice(["Repeat after me: {w}", "Say exactly this: {w}", "Please repeat: {w}", "Echo: {w}"])
        return q.format(w=words), "The user wants the words repeated exactly.", words

    def short_example(self) -> Example:
        q, thought, answer = self.short()
        messages = self.with_context([{"role": "user", "content": q}])
        return Example("short", messages, None, self.rng.random() < 0.6, thought, answer)

    def with_context(self, messages: list) -> list:
        """Sometimes a system turn and an earlier exchange before the request."""
        r = self.rng
        if r.random() < 0.25:
            q, a = r.choice(GREETINGS)
            messages = [{"role": "user", "content": q}, {"role": "assistant", "content": a}] + messages
        if r.random() < 0.3:
            messages = [{"role": "system", "content": r.choice(["You are a helpful assistant.",
                                                                "You are a concise assistant.",
                                                                "Answer briefly and use tools when useful."])}] + messages
        return messages

    # ---- tools -----------------------------------------------------------------------------------------------
    def tool_examples(self) -> list[Example]:
        """One request served by a tool, as the call and (sometimes) the answer after the result; or a request
        that no offered tool serves."""
        r = self.rng
        classes = r.sample(DOMAINS, r.choices([1, 2, 3], [4, 4, 2])[0])
        built = []
        for cls in classes:
            domain = cls(r, self.held_out)
            params, required, ask, result, answer = domain.build()
            name = domain.name()
            given = [p.name for p in params]
            tool = domain.tool(name, params, [k for k in required if k in given])
            built.append((tool, name, params, ask, result, answer))
        tools = [b[0] for b in built]
        thinking = r.random() < 0.6
        if r.random() < 0.15:  # a request none of them serves
            q, thought, answer = self.short()
            messages = self.with_context([{"role": "user", "content": q}])
            return [Example("no_tool", messages, tools, thinking, thought + " No tool is needed.", answer)]
        _, name, params, ask, result, answer = r.choice(built)
        args = {p.name: p.value for p in params if p.value is not None}
        call = "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"
        thought = f"The tool {name} can answer this, so I call it" + (" with no arguments." if not args else ".")
        messages = self.with_context([{"role": "user", "content": ask}])
        out = [Example("tool", messages, tools, thinking, thought, call)]
        if r.random() < 0.3:
            done = messages + [{"role": "assistant", "content": "",
                                "tool_calls": [{"type": "function", "id": "call_0",
                                                "function": {"name": name, "arguments": json.dumps(args)}}]},
                               {"role": "tool", "tool_call_id": "call_0", "content": result}]
            out.append(Example("tool_result", done, tools, thinking, "The tool answered; I report its result.",
                               answer))
        return out


def reply_text(example: Example) -> str:
    """What the model learns to write after the generation prompt (with thinking on, the think block first)."""
    body = example.answer + "<|im_end|>\n"
    return f"<think>\n{example.thought}\n</think>\n\n{body}" if example.thinking else body


def render(tokenizer, example: Example) -> tuple[str, str]:
    """(prompt, reply): the prompt rendered by the chat template, thinking on or off."""
    kwargs = {"tools": example.tools} if example.tools else {}
    prompt = tokenizer.apply_chat_template(example.messages, tokenize=False, add_generation_prompt=True,
                                           enable_thinking=example.thinking, **kwargs)
    return prompt, reply_text(example)
