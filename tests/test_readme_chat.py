"""The README's chat example, run as written against ``minivllm serve`` of the shipped demo model, prints what
the README shows (on the CPU)."""

from __future__ import annotations

import contextlib
import io
import re

import pytest

from tests.helpers.server_utils import ROOT, running_server

pytestmark = [pytest.mark.server, pytest.mark.skipif(not (ROOT / "models" / "minivllm-demo-py").is_dir(), reason="no demo model")]
DEMO = ROOT / "models" / "minivllm-demo-py"


def readme_chat_example() -> tuple[str, str]:
    """The README's Python block that streams a chat completion, and the text block that follows it."""
    text = (ROOT / "README.md").read_text()
    block = next(m for m in re.finditer(r"```python\n(.*?)```", text, re.S) if "chat.completions.create" in m[1])
    shown = re.compile(r"```text\n(.*?)```", re.S).search(text, block.end())
    assert shown, "README's chat example is not followed by its output"
    return block[1], shown[1]


def test_the_readme_chat_example_prints_what_the_readme_shows(tmp_path):
    code, shown = readme_chat_example()
    with running_server(str(DEMO), ["--served-model-name", "demo", "--device", "cpu"], tmp_path) as srv:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(code.replace("http://127.0.0.1:8000", srv.url), {"__name__": "readme"})  # noqa: S102
    assert out.getvalue().strip() == shown.strip()
