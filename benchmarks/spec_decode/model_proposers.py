"""The model-based proposers on the demo model over held-out Python: the shipped EAGLE-3 head (and, as the
ceiling where every draft is accepted, the demo model as its own draft), acceptance rate, mean acceptance length
and end-to-end output tokens per second for each k, against no speculation (same prompts as
``ngram_acceptance.py``, greedy, outputs checked equal).

    python benchmarks/spec_decode/model_proposers.py                        # eagle3, k = 1..5 on the CPU
    python benchmarks/spec_decode/model_proposers.py --method draft_model --k 2 4
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # NOTE: benchmarks/ is not a package
from ngram_acceptance import DEMO, add_workload_args, baseline, print_rows, speculative_rows  # noqa: E402

HEAD = DEMO.parent / "minivllm-demo-py-eagle3"


def main(argv: list[str] | None = None) -> list[dict]:
    """Run the measurement; returns one row per k (k = 0: no speculation)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--method", choices=["eagle3", "draft_model"], default="eagle3")
    p.add_argument("--k", type=int, nargs="+", default=[1, 2, 3, 4, 5], help="num_speculative_tokens to try")
    add_workload_args(p)
    args = p.parse_args(argv)
    params, engine, prompts, expected, rows = baseline(args, 1)
    draft = str(HEAD if args.method == "eagle3" else DEMO)
    specs = [{"method": args.method, "model": draft, "num_speculative_tokens": k} for k in args.k]
    rows += speculative_rows(str(DEMO), specs, prompts, params, engine, expected)
    print_rows(rows, f"demo model, {args.method} ({draft}), {args.num_prompts} held-out prompts x {args.output_len} "
               f"tokens, one request at a time, {args.device}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    return rows


if __name__ == "__main__":
    main()
