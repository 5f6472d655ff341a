"""The suite's own rules (tests/conftest.py): this checkout's code is what runs, the GPU tier is deselected
without CUDA, and a skip outside the allowlist fails the run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import minivllm
import tests
from tests.conftest import CUDA

ROOT = Path(__file__).resolve().parents[1]


def test_this_checkout_is_imported_here_and_in_processes_the_tests_start():
    """Plain ``pytest`` (pyproject's ``pythonpath``), not an installed or editable minivllm from elsewhere."""
    assert Path(minivllm.__file__).resolve() == ROOT / "minivllm" / "__init__.py"
    assert Path(tests.__file__).resolve() == ROOT / "tests" / "__init__.py"
    code = "import minivllm; print(minivllm.__file__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    assert Path(out.stdout.strip()).resolve() == ROOT / "minivllm" / "__init__.py"


_TESTS = """
import pytest

def test_runs():
    pass

@pytest.mark.gpu
def test_on_a_gpu():
    pass

def test_skips():
    pytest.skip("for no listed reason")
"""


def test_gpu_tier_is_deselected_and_an_unlisted_skip_fails_the_run(tmp_path):
    """pytest on a folder with tests/conftest.py's hooks (``-p tests.conftest``): a skip in a test and one at
    collection (a module-level importorskip) are named, and the run fails."""
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: a GPU test\n")
    (tmp_path / "test_a.py").write_text(_TESTS)
    (tmp_path / "test_b.py").write_text('import pytest\n\npytest.importorskip("no_such_module_here")\n')
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider",
                           "-c", str(tmp_path / "pytest.ini"), str(tmp_path)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    counts = "2 passed, 2 skipped" if CUDA else "1 passed, 2 skipped, 1 deselected"
    assert counts in done.stdout, done.stdout
    assert "2 skipped outside the allowlist" in done.stdout, done.stdout
    assert "test_a.py::test_skips: for no listed reason" in done.stdout
    assert "test_b.py: could not import 'no_such_module_here'" in done.stdout
