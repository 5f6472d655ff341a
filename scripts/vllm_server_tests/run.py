"""Run vLLM's own server tests against ``minivllm serve`` on a shipped demo model, and report.

    python scripts/vllm_server_tests/run.py --vllm-tests PATH [--out report.md] [--only SUBSTR ...] [--model DIR]

PATH is the root of vLLM's source (the one holding ``tests/entrypoints``). Each selected file runs in its own
pytest process, one after the other (each module starts its own server, as in vLLM's CI). The report: per
file passed / failed / error / skipped / excluded, the totals, the files left out with their reasons, and
each failing test with its one-line failure, grouped by the missing behaviour (selection.CAUSES)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import selection  # noqa: E402
import stage as staging  # noqa: E402

REPO_ROOT = HERE.parents[1]
OUTCOMES = ("passed", "failed", "error", "skipped", "excluded")


def run_file(rel: str, paths: dict, stage_dir: Path, timeout_s: int, test_timeout_s: int) -> tuple[list[dict], float]:
    results = stage_dir / "results" / (rel.replace("/", "__") + ".jsonl")
    results.parent.mkdir(parents=True, exist_ok=True)
    results.unlink(missing_ok=True)
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join([str(stage_dir), str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
           "VLLMTESTS_HARNESS": str(HERE), "VLLMTESTS_RESULTS": str(results),
           "VLLMTESTS_MODEL": str(paths["model"]), "VLLMTESTS_REPO_ROOT": str(REPO_ROOT),
           "VLLMTESTS_VLLM_ROOT": str(stage_dir), "VLLMTESTS_LOG_DIR": str(stage_dir / "logs" / rel.replace("/", "__")),
           "VLLMTESTS_TEST_TIMEOUT_S": str(test_timeout_s),
           "HF_HOME": str(paths["hf_home"]), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    env.pop("MINIVLLM_API_KEY", None)
    cmd = [sys.executable, "-m", "pytest", str(paths["tests"] / rel), "-c", str(stage_dir / "pytest.ini"),
           "--rootdir", str(stage_dir), "-p", "no:cacheprovider", "-q", "-vv", "-rN", "--no-header"]
    start = time.monotonic()
    log = stage_dir / "logs" / (rel.replace("/", "__") + ".pytest.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        try:
            proc = subprocess.run(cmd, cwd=stage_dir, env=env, stdout=out, stderr=subprocess.STDOUT,
                                  timeout=timeout_s)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    entries = [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []
    if not entries or rc == "timeout" or rc not in (0, 1, 5):
        tail = " ".join(log.read_text().strip().splitlines()[-3:])[-300:] if log.exists() else ""
        entries.append({"nodeid": f"{rel}::<file>", "outcome": "error",
                        "message": f"pytest ended with {rc} ({'over ' + str(timeout_s) + ' s' if rc == 'timeout' else tail})"})
    return entries, time.monotonic() - start


def outcome_per_test(entries: list[dict]) -> dict[str, dict]:
    """One outcome per test: a failure or an error in any phase wins over a pass."""
    rank = {"excluded": 0, "passed": 1, "skipped": 2, "teardown-error": 1, "error": 3, "failed": 4}
    per: dict[str, dict] = {}
    for e in entries:
        if e["nodeid"] not in per or rank[e["outcome"]] > rank[per[e["nodeid"]]["outcome"]]:
            per[e["nodeid"]] = e
    for e in per.values():
        if e["outcome"] == "teardown-error":
            e["outcome"] = "passed"
    return per


def clip(text: str, n: int = 400) -> str:
    text = text.replace("|", "\\|")
    return text if len(text) <= n else text[: n - 1] + "…"


def report(per_file: dict[str, dict[str, dict]], times: dict[str, float], applied: list[dict], vllm_root: Path,
           served_model: Path) -> str:
    totals: Counter = Counter()
    lines = ["| file | passed | failed | error | skipped | excluded | time |", "|---|---:|---:|---:|---:|---:|---:|"]
    for rel, tests in per_file.items():
        c = Counter(t["outcome"] for t in tests.values())
        totals.update(c)
        lines.append(f"| {rel} | " + " | ".join(str(c[o]) for o in OUTCOMES) + f" | {times.get(rel, 0):.0f} s |")
    lines.append("| **total** | " + " | ".join(f"**{totals[o]}**" for o in OUTCOMES) + " | |")
    applies = totals["passed"] + totals["failed"] + totals["error"]
    bad = totals["failed"] + totals["error"]
    failing = [(nodeid, t) for tests in per_file.values() for nodeid, t in tests.items()
               if t["outcome"] in ("failed", "error")]
    model = {nodeid: selection.model_limited(nodeid, t["message"]) for nodeid, t in failing}
    n_model = sum(1 for why in model.values() if why)
    version = next((line.split(":", 1)[1].strip() for line in (vllm_root / "PKG-INFO").read_text().splitlines()
                    if line.startswith("Version:")), "?") if (vllm_root / "PKG-INFO").exists() else "a checkout"
    served = served_model.relative_to(REPO_ROOT) if served_model.is_relative_to(REPO_ROOT) else served_model
    out = [f"vLLM's tests: {version} (`{vllm_root}`); model served: `{served}`", "",
           f"**{applies} tests apply: {totals['passed']} pass, {totals['failed']} fail, {totals['error']} error "
           f"({100 * bad / max(applies, 1):.1f}% fail or error; {n_model} of them only because a 6.9M-parameter "
           f"model cannot give the answer, tagged [model]).** Skipped by vLLM's own marks: {totals['skipped']}; "
           f"deselected as not applicable: {totals['excluded']}.", "", *lines, ""]
    groups: dict[str, list[str]] = defaultdict(list)
    for nodeid, t in failing:
        tag = f" [model: {model[nodeid]}]" if model[nodeid] else ""
        groups[selection.cause_of(nodeid)].append(f"- `{nodeid}` ({t['outcome']}){tag}: {clip(t['message'])}")
    out.append("## Failing tests, by missing behaviour\n")
    for cause in sorted(groups, key=lambda c: (c.startswith("other"), -len(groups[c]), c)):
        out += [f"### {cause} ({len(groups[cause])})", "", *groups[cause], ""]
    skipped = [(n, t) for tests in per_file.values() for n, t in tests.items() if t["outcome"] == "skipped"]
    if skipped:
        out += ["## Skipped by vLLM's own marks\n", *[f"- `{n}`: {clip(t['message'], 200)}" for n, t in skipped], ""]
    out += ["## Adaptations applied to the staged copies\n",
            *[f"- `{a['file']}`: `{a['old']}` → `{a['new']}` ({a['count']}×): {a['why']}" for a in applied], ""]
    excluded = Counter((rel, t["message"]) for rel, tests in per_file.items() for t in tests.values()
                       if t["outcome"] == "excluded")
    out += ["## Tests deselected in the files that run\n",
            *[f"- `{rel}`: {n} × {why}" for (rel, why), n in sorted(excluded.items())], "",
            "## Files that do not apply\n",
            *[f"- `{pattern}`: {why}" for pattern, why in selection.EXCLUDED_FILES], ""]
    return "\n".join(out)


def unlisted_files(tests_dir: Path) -> list[str]:
    """Test files of openai/ and serve/ neither selected nor excluded (a newer vLLM added them)."""
    rels = sorted(str(p.relative_to(tests_dir)) for sub in ("openai", "serve") for p in (tests_dir / sub).rglob("test_*.py"))
    return [r for r in rels if r not in selection.SELECTED and selection.file_exclusion(r) is None]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm-tests", type=Path, required=True, help="root of vLLM's source (holds tests/)")
    parser.add_argument("--out", type=Path, help="write the report (markdown) here too")
    parser.add_argument("--stage", type=Path, default=Path("/tmp/minivllm-vllm-tests"), help="work folder")
    parser.add_argument("--only", nargs="*", default=[], help="run only the selected files containing these")
    parser.add_argument("--model", type=Path, default=staging.DEFAULT_MODEL,
                        help="the checkpoint folder to serve (default: %(default)s)")
    parser.add_argument("--file-timeout-s", type=int, default=1500)
    parser.add_argument("--test-timeout-s", type=int, default=300)
    parser.add_argument("--report-only", action="store_true", help="report the results of the last run again")
    args = parser.parse_args()
    try:
        import pytest_asyncio  # noqa: F401
    except ImportError:
        raise SystemExit("vLLM's tests need pytest-asyncio: pip install pytest-asyncio pybase64") from None
    vllm_root = staging.find_vllm_tests(args.vllm_tests.resolve())
    if not (args.model / "config.json").is_file():
        raise SystemExit(f"--model {args.model}: not a checkpoint folder (no config.json)")
    paths = staging.stage(vllm_root, args.stage, args.model.resolve())  # NOTE: also with --report-only, for the adaptations' list
    unlisted = unlisted_files(paths["tests"])
    files = [f for f in selection.SELECTED if not args.only or any(s in f for s in args.only)]
    per_file: dict[str, dict[str, dict]] = {}
    times: dict[str, float] = {}
    for rel in files:
        if args.report_only:
            results = args.stage / "results" / (rel.replace("/", "__") + ".jsonl")
            entries = [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []
            times_file = args.stage / "results" / "times.json"
            times[rel] = json.loads(times_file.read_text()).get(rel, 0) if times_file.exists() else 0
        else:
            entries, times[rel] = run_file(rel, paths, args.stage, args.file_timeout_s, args.test_timeout_s)
            times_file = args.stage / "results" / "times.json"
            known = json.loads(times_file.read_text()) if times_file.exists() else {}
            times_file.write_text(json.dumps({**known, rel: times[rel]}))
        per_file[rel] = outcome_per_test(entries)
        c = Counter(t["outcome"] for t in per_file[rel].values())
        print(f"{rel}: " + ", ".join(f"{c[o]} {o}" for o in OUTCOMES) + f" ({times[rel]:.0f} s)", flush=True)
    text = report(per_file, times, paths["adaptations"], vllm_root, args.model.resolve())
    if unlisted:
        text += "\n## Files neither selected nor excluded (classify them in selection.py)\n\n" + "\n".join(
            f"- `{r}`" for r in unlisted) + "\n"
    print("\n" + text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
