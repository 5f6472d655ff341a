"""Chat data for the demo model: questions about the standard library answered by its own docstrings.

For each public function, class and method with a docstring in the training files (``What does
`os.path.join` do?``), the answer is the docstring's first paragraph. ``posixpath`` is asked about as
``os.path``, as users know it.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

QUESTIONS = ("What does `{}` do?", "Explain `{}`.", "What is `{}` for?", "Tell me about `{}`.")
ALIASES = {"posixpath": "os.path"}
MIN_CHARS, MAX_CHARS = 24, 360


def module_name(rel: Path) -> str:
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    name = ".".join(parts)
    return ALIASES.get(name, name)


def first_paragraph(doc: str) -> str | None:
    """The docstring's first paragraph on one line, or None if it is too short, too long or a signature."""
    para = inspect.cleandoc(doc).split("\n\n", 1)[0]
    text = re.sub(r"\s+", " ", para).strip()
    if not MIN_CHARS <= len(text) <= MAX_CHARS or re.match(r"^\w+\(.*\)\s*->", text):
        return None
    return text


def documented_names(source: str, module: str) -> list[tuple[str, str]]:
    """``(qualified name, answer)`` of the module's public documented functions, classes and methods."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    out = []

    def visit(body, prefix):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
                doc = ast.get_docstring(node, clean=False)
                answer = first_paragraph(doc) if doc else None
                if answer:
                    out.append((f"{prefix}.{node.name}", answer))
                if isinstance(node, ast.ClassDef):
                    visit(node.body, f"{prefix}.{node.name}")

    visit(tree.body, module)
    return out


def qa_pairs(root: Path, files: list[Path]) -> list[tuple[str, str]]:
    """``(question, answer)`` for every documented public name of ``files`` (under the stdlib ``root``)."""
    pairs = []
    for path in files:
        rel = path.relative_to(root)
        if any(p.startswith("_") for p in rel.parts) and rel.name != "__init__.py":
            continue
        for i, (name, answer) in enumerate(documented_names(path.read_text(encoding="utf-8", errors="replace"),
                                                             module_name(rel))):
            pairs.append((QUESTIONS[(len(name) + i) % len(QUESTIONS)].format(name), answer))
    return pairs


def encode_pairs(tokenizer, pairs: list[tuple[str, str]], max_len: int) -> list[tuple[list[int], list[int]]]:
    """Each pair as ChatML ``(input ids, labels)``; only the answer and its ``<|im_end|>`` are learned (labels
    -100 elsewhere). Pairs longer than ``max_len`` tokens are dropped."""
    out = []
    for question, answer in pairs:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                               add_generation_prompt=True)
        p_ids = tokenizer.encode(prompt, add_special_tokens=False)
        a_ids = tokenizer.encode(answer + "<|im_end|>\n", add_special_tokens=False)
        ids = p_ids + a_ids
        if len(ids) <= max_len:
            out.append((ids, [-100] * len(p_ids) + a_ids))
    return out
