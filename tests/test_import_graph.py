"""No import cycles in the package, and every module of it imports first in a fresh interpreter.

The graph is built from the source (lazy imports inside functions count: a cycle through one still ties the
modules together, and breaks whoever imports the other side first). ``import a.b.c`` depends on ``a.b.c``;
``from a.b import c`` on ``a.b.c`` if that is a module, else on ``a.b``; a package's ``__init__`` is a module of
its own; relative imports are resolved.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "minivllm"

#: modules that are scripts, not imported: importing ``bench/__main__`` would run the benchmark CLI
NOT_IMPORTED = {"minivllm.entrypoints.bench.__main__"}


def module_files(pkg: Path = PKG) -> dict[str, Path]:
    """Every module of the package by name (a package by its ``__init__.py``)."""
    out = {}
    for path in sorted(pkg.rglob("*.py")):
        parts = path.relative_to(pkg.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imported_names(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The dotted names ``name`` imports anywhere in its file, relative imports resolved."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for a in node.names:
                out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base)
    return out


def import_graph(pkg: Path = PKG) -> dict[str, set[str]]:
    """``{module: the package's modules it imports}``."""
    modules = module_files(pkg)
    graph = {}
    for name, path in modules.items():
        deps = set()
        for target in _imported_names(name, path, modules):
            while target and target not in modules:  # NOTE: an attribute of a module, e.g. `import a.b` of a.b.c
                target = target.rpartition(".")[0]
            if target.split(".")[0] == pkg.name and target != name:
                deps.add(target)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(frozenset(comp))
    return out


def _describe(comp: frozenset[str], graph: dict[str, set[str]]) -> str:
    edges = [f"{a} -> {b}" for a in sorted(comp) for b in sorted(graph[a] & comp)]
    return f"{len(comp)} modules: " + "; ".join(edges)


def test_the_graph_sees_lazy_relative_and_from_imports(tmp_path):
    graph = import_graph()
    assert "minivllm.scale_out.serve.app" in graph["minivllm.entrypoints.cli"]  # lazy, inside _serve
    assert "minivllm.entrypoints.openai.protocol" in graph["minivllm.entrypoints.openai.errors"]  # from a import b
    assert "minivllm.sampling_params" in graph["minivllm"]  # a package's __init__
    pkg = tmp_path / "pkg"
    for name, text in {"__init__.py": "from pkg.sub import thing\n", "top.py": "import os\n",
                       "sub/__init__.py": "from .. import top\nthing = 1\n",
                       "sub/mod.py": "from . import thing\nfrom ..top import x\n",
                       "sub/lazy.py": "def f():\n    import pkg.sub.mod.attr\n"}.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    assert import_graph(pkg) == {"pkg": {"pkg.sub"}, "pkg.top": set(), "pkg.sub": {"pkg.top"},
                                 "pkg.sub.mod": {"pkg.sub", "pkg.top"}, "pkg.sub.lazy": {"pkg.sub.mod"}}


def test_a_cycle_is_found_with_its_modules():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert cycles(graph) == [frozenset("abc")]


def test_no_import_cycles():
    """Every strongly connected component of the import graph is a single module, but the known ones."""
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(_describe(c, graph) for c in found)


# Each module is imported by a fork of one process that has loaded the third-party modules the package imports at
# module level (torch, transformers, fastapi, ray, ...) and no module of minivllm: so each module is the first of
# the package to be imported, as in a fresh interpreter, and a fork costs only the package's own import time.
_DRIVER = r"""
import importlib, importlib.util, json, os, sys, traceback
modules, preload, out_dir = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
for name, attrs in preload:
    try:
        mod = importlib.import_module(name)
    except Exception:
        continue  # NOTE: not installed, or broken: the modules that need it report it themselves
    for attr in attrs:
        try:
            getattr(mod, attr) if hasattr(mod, attr) else importlib.import_module(f"{name}.{attr}")
        except Exception:
            pass
loaded = sorted(m for m in sys.modules if m == "minivllm" or m.startswith("minivllm."))
assert not loaded, f"the preload imported minivllm modules: {loaded}"


def child(name):
    try:
        importlib.import_module(name)
        return 0
    except BaseException as exc:
        missing = exc.name.split(".")[0] if isinstance(exc, ModuleNotFoundError) and exc.name else None
        code = 2 if missing and missing != "minivllm" and importlib.util.find_spec(missing) is None else 1
        with open(os.path.join(out_dir, name), "w") as f:
            f.write(f"missing {missing}" if code == 2 else traceback.format_exc())
        return code


results, running, todo = {}, {}, list(modules)
while todo or running:
    while todo and len(running) < max(2, os.cpu_count() or 1):
        name = todo.pop()
        pid = os.fork()
        if pid == 0:
            code = child(name)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        running[pid] = name
    pid, status = os.wait()
    results[running.pop(pid)] = os.waitstatus_to_exitcode(status)
print(json.dumps(results))
"""


def _module_level_imports(path: Path) -> set[tuple[str, tuple[str, ...]]]:
    """``(module, names)`` of the absolute imports outside functions of a file, minivllm's left out."""
    out = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.Import):
                out.update((a.name, ()) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and not child.level:
                out.add((child.module, tuple(a.name for a in child.names)))
            visit(child)

    visit(ast.parse(path.read_text()))
    return {(m, names) for m, names in out if m.split(".")[0] != "minivllm"}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="forks one process per module")
def test_every_module_imports_first_in_a_fresh_interpreter(tmp_path):
    files = module_files()
    modules = sorted(set(files) - NOT_IMPORTED)
    assert NOT_IMPORTED <= set(files)
    preload = sorted({imp for path in files.values() for imp in _module_level_imports(path)})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps(modules), json.dumps(preload), str(tmp_path)],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-5000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(results) == modules
    failed = {m: (tmp_path / m).read_text() if (tmp_path / m).exists() else f"exit code {code}"
              for m, code in results.items() if code not in (0, 2)}
    assert not failed, "\n\n".join(f"{m}:\n{why}" for m, why in sorted(failed.items()))
    missing = {m: (tmp_path / m).read_text() for m, code in results.items() if code == 2}
    if missing:  # NOTE: an optional dependency that is not installed here (e.g. triton without a GPU build)
        pytest.skip(f"{len(missing)} modules need what is not installed: {sorted(missing.items())}")
