"""The ``minivllm`` command as a newcomer meets it: one line naming the extra to install when ``serve`` (or ``bench
serve``) lacks one."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers.server_utils import ROOT

DEMO = str(ROOT / "models" / "minivllm-demo-py")


# NOTE: a fresh interpreter in which importing the named top-level modules fails, as when they are not installed
_WITHOUT = """
import sys

class Missing:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

BLOCKED = set(sys.argv[1].split(","))
sys.meta_path.insert(0, Missing())
from minivllm.entrypoints.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("blocked, argv, install", [
    ("fastapi", ["serve", DEMO, "--device", "cpu"], '".[server]"'),
    ("uvicorn", ["serve", DEMO, "--device", "cpu"], '".[server]"'),
    ("ray", ["serve", DEMO, "--device", "cpu", "--data-parallel-size", "2"], '".[server,ray]"'),
    ("httpx", ["bench", "serve", "--base-url", "http://127.0.0.1:9"], '".[server]"'),
], ids=["serve-fastapi", "serve-uvicorn", "serve-ray", "bench-serve-httpx"])
def test_a_missing_extra_is_one_line_naming_the_command_that_installs_it(blocked, argv, install):
    done = subprocess.run([sys.executable, "-c", _WITHOUT, blocked, *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"no module named '{blocked}'" in done.stderr and f"pip install -e {install}" in done.stderr, done.stderr
