"""The ``minivllm`` command as a newcomer meets it: ``--version``, help texts with their defaults, and one line
naming the extra to install when ``serve`` (or ``bench serve``) lacks one."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from dataclasses import MISSING

import pytest

import minivllm
from tests.helpers.server_utils import ROOT

DEMO = str(ROOT / "models" / "minivllm-demo-py")


def _run_cli(argv: list[str], capsys) -> str:
    """What ``minivllm ARGV`` prints to stdout, when it exits 0 (``--help``, ``--version``)."""
    from minivllm.entrypoints import cli

    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_version(capsys):
    assert _run_cli(["--version"], capsys) == f"minivllm {minivllm.__version__}\n"


def test_serve_help_shows_every_default(capsys):
    from minivllm.config.server import ServerConfig
    from minivllm.entrypoints.args import engine_flags, flags_of

    text = " ".join(_run_cli(["serve", "--help"], capsys).split())  # NOTE: argparse wraps to the terminal's width
    assert "port to listen on (default: 8000)" in text and "most sequences in one step (default: 256)" in text
    assert "share the KV blocks of common prompt prefixes between requests (default: True)" in text
    listing = text.index("positional arguments:")  # past the usage line
    for flag, _, _, meta in engine_flags() + flags_of(ServerConfig):
        shown = text[re.search(re.escape(flag) + "[ ,]", text[listing:]).start() + listing:]
        if all(meta["default"] is not x for x in (None, False, MISSING)):  # else the text says what then
            assert "default" in shown[:len(flag) * 2 + len(meta["help"]) + 40], flag


def test_bench_help_is_for_users_and_every_bench_flag_has_help(capsys):
    from minivllm.entrypoints.cli import build_parser

    text = _run_cli(["bench", "--help"], capsys)
    assert "minivllm bench throughput --model tiny-qwen3" in text and "--disable-tqdm" in text
    assert "add_bench_parser" not in text and "argparse" not in text and "torch" not in text
    commands = _subcommands(_subcommands(build_parser())["bench"])
    assert set(commands) == {"throughput", "latency", "serve"}
    for name, parser in [*commands.items(), ("generate", _subcommands(build_parser())["generate"])]:
        flags = [a for a in parser._actions if a.option_strings and a.help != argparse.SUPPRESS]
        assert len(flags) > 5, name
        for action in flags:
            assert action.help, (name, action.option_strings)
        if name != "generate":
            assert any(a.option_strings == ["--disable-tqdm"] for a in flags), name
    text = " ".join(_run_cli(["bench", "latency", "--help"], capsys).split())
    assert "requests in the batch (default: 8)" in text and "``" not in text


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


@pytest.mark.parametrize("flags, message", [
    (["--watermark-config", '{"key": 1, "algorithm": "sbw"}'], "watermark_config.algorithm must be one of"),
    (["--watermark-config", "{key: 1}"], "watermark_config must be a JSON object"),
    (["--reasoning-config", '{"start": "<think>"}'], "reasoning_config: unknown key(s) start"),
    (["--max-num-seqs", "0"], "max_num_seqs must be >= 1"),
])
def test_a_bad_engine_flag_is_one_line_before_the_server_starts(flags, message):
    """``serve`` checks the engine's configuration first: the message names the flag's field, and no server or
    engine thread starts (no traceback in the log)."""
    from minivllm.entrypoints import cli

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["serve", DEMO, "--device", "cpu", "--port", "1", *flags])
    assert str(exit_info.value.code).startswith("minivllm: ") and message in str(exit_info.value.code)
