"""The demo LoRA's task: the corpus's function docstrings rewritten in the Google style.

Each documented function of a stdlib file keeps its signature, the first paragraph of its docstring (the
summary) and the first lines of its body; the rest of the docstring becomes an ``Args:`` section listing every
parameter but ``self`` and ``cls`` (``name (annotation): The name.``) and, when the function returns a value,
a ``Returns:`` section (the summary's "Return X" as "X.", else "The result."). For example
``def basename(p):`` documented "Returns the final component of a pathname" becomes::

    def basename(p):
        \"\"\"Returns the final component of a pathname.

        Args:
            p: The p.

        Returns:
            The final component of a pathname.
        \"\"\"

The base model writes its docstrings as the stdlib does (prose); the adapter, in this form.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from dataclasses import dataclass

WRAP = 88  # the column the summary is wrapped at
MAX_SUMMARY_CHARS = 240
BODY_LINES = 3  # lines of the body kept after the docstring
SKIPPED_PARAMS = ("self", "cls")


@dataclass(frozen=True)
class DocumentedFunction:
    """One function of a source file, in pieces: what comes before its docstring and what the rewrite needs."""

    name: str
    header: str  # from the ``def`` line to the line before the docstring, newline-terminated
    indent: str  # the docstring's indentation
    summary: str  # the docstring's first paragraph on one line
    params: tuple[str, ...]  # "name" or "name (annotation)", with * / ** for varargs
    returns_value: bool
    body: str  # the first BODY_LINES lines after the docstring

    @property
    def prompt(self) -> str:
        """The function up to its docstring's opening quotes: what a model is asked to continue."""
        return f'{self.header}{self.indent}"""'

    def google_docstring(self) -> str:
        """The docstring in the Google style, from its opening quotes to its closing line (newline-terminated)."""
        lines = textwrap.wrap(self.summary, WRAP - len(self.indent) - 3) or [""]
        out = [f'{self.indent}"""{lines[0]}', *(f"{self.indent}{line}" for line in lines[1:])]
        if self.params:
            out += ["", f"{self.indent}Args:"]
            out += [f"{self.indent}    {param}: The {describe(param)}." for param in self.params]
        if self.returns_value:
            out += ["", f"{self.indent}Returns:", f"{self.indent}    {returned(self.summary)}"]
        if len(out) > 1:
            out.append(f'{self.indent}"""')
        else:
            out[0] += '"""'
        return "\n".join(line.rstrip() for line in out) + "\n"

    def rewritten(self) -> str:
        """The function's header, Google-style docstring and first body lines."""
        return self.header + self.google_docstring() + self.body


def describe(param: str) -> str:
    """``max_size (int)`` -> ``max size``: the parameter's name in words."""
    return param.split(" (", 1)[0].lstrip("*").replace("_", " ")


def returned(summary: str) -> str:
    """What the Returns section says: the summary's object when it starts with "Return(s)", else "The result."."""
    match = re.match(r"^Returns? (.+)$", summary)
    if not match:
        return "The result."
    text = match.group(1).rstrip(".")
    return text[0].upper() + text[1:] + "."


def parameter_names(args: ast.arguments) -> tuple[str, ...]:
    """The parameters as an Args section lists them: ``name`` or ``name (annotation)``, ``*args``, ``**kw``."""
    named = [(a, "") for a in (*args.posonlyargs, *args.args)]
    if args.vararg:
        named.append((args.vararg, "*"))
    named += [(a, "") for a in args.kwonlyargs]
    if args.kwarg:
        named.append((args.kwarg, "**"))
    out = []
    for arg, star in named:
        if arg.arg in SKIPPED_PARAMS:
            continue
        note = f" ({ast.unparse(arg.annotation)})" if arg.annotation is not None else ""
        out.append(f"{star}{arg.arg}{note}")
    return tuple(out)


def returns_a_value(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether a ``return <value>`` belongs to the function itself (not to a nested function or class)."""
    stack = list(fn.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Return) and node.value is not None:
            return True
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(node))
    return False


def summary_of(doc: str) -> str | None:
    """The docstring's first paragraph on one line, or None where it cannot be rewritten safely."""
    text = re.sub(r"\s+", " ", inspect.cleandoc(doc).split("\n\n", 1)[0]).strip()
    if not 8 <= len(text) <= MAX_SUMMARY_CHARS or "\\" in text or '"""' in text or text.endswith(":"):
        return None
    return text if text.endswith((".", "!", "?")) else text + "."


def documented_functions(source: str) -> list[DocumentedFunction]:
    """Every function of ``source`` whose docstring opens with ``\"\"\"`` on its own line below the signature."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    lines = source.splitlines(keepends=True)
    out = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or not fn.body:
            continue
        doc = fn.body[0]
        if not (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str)):
            continue
        first = lines[doc.lineno - 1]
        indent = first[: doc.col_offset]
        if doc.lineno <= fn.lineno or indent.strip() or not first[doc.col_offset:].startswith('"""'):
            continue
        summary = summary_of(doc.value.value)
        if summary is None:
            continue
        body_end = doc.end_lineno
        body = [line for line in lines[body_end: body_end + BODY_LINES] if line.startswith(indent) or not line.strip()]
        out.append(DocumentedFunction(
            name=fn.name, header="".join(lines[fn.lineno - 1: doc.lineno - 1]), indent=indent, summary=summary,
            params=parameter_names(fn.args), returns_value=returns_a_value(fn), body="".join(body),
        ))
    return out


def docstring_of_completion(completion: str) -> str:
    """The docstring part of a model's continuation of ``DocumentedFunction.prompt`` (up to the closing quotes)."""
    return completion.split('"""', 1)[0]


def is_google_style(fn: DocumentedFunction, completion: str) -> bool:
    """Whether a continuation's docstring has an Args section naming every parameter (or, without
    parameters, any Args/Returns section)."""
    doc = docstring_of_completion(completion)
    if not fn.params:
        return "Args:" in doc or "Returns:" in doc
    if "Args:" not in doc:
        return False
    section = doc.split("Args:", 1)[1]
    return all(re.search(rf"^\s+\**{re.escape(describe_name(p))}\b", section, re.M) for p in fn.params)


def describe_name(param: str) -> str:
    """``*args (int)`` -> ``args``: the bare parameter name."""
    return param.split(" (", 1)[0].lstrip("*")
