"""Output throughput of fixed-length batches at several batch sizes (the data of the first plot).

One engine is built (``max_num_seqs`` = the largest batch unless given) and each batch size
runs one timed ``generate`` of random prompts (fresh ones per size: no prefix-cache hits),
``--input-len`` tokens -> ``--output-len`` greedy tokens, EOS ignored. ``--hf`` also runs the
transformers baseline at each size (after our engine is closed). Writes JSON for
``benchmarks/engine/plot.py``:

    python benchmarks/engine/throughput_vs_batch.py --model qwen3-0.6b --json-out runs/tvb_0.6b.json
    python benchmarks/engine/plot.py runs/
"""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from minivllm.entrypoints.bench import common, throughput  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-sizes", default="1,8,32,64,128,256", help="comma-separated")
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--hf", action="store_true", help="also run transformers generate at each batch size")
    common.add_engine_args(p)
    args = p.parse_args(argv)
    sizes = [int(x) for x in args.batch_sizes.split(",") if x.strip()]
    path, kw = common.engine_kwargs(args)
    kw.setdefault("max_num_seqs", max(sizes))
    hi = common.vocab_limit(path)

    def requests(i: int, bs: int):
        spec = dict(throughput.WORKLOADS["fixed-batch"], num_requests=bs, min_input_len=args.input_len,
                    max_input_len=args.input_len, min_output_len=args.output_len, max_output_len=args.output_len)
        return throughput.make_requests(spec, args.seed + i, hi)

    from minivllm.llm import LLM

    results = []
    llm = LLM(path, **kw)
    our_dtype = llm.engine.config.model_config.dtype
    try:
        throughput.warm_up(llm)
        for i, bs in enumerate(sizes):
            prompts, max_tokens = requests(i, bs)
            r = throughput.timed_generate(llm, prompts, max_tokens, 0.0, 0, hi)
            results.append({"batch_size": bs, "output_tok_s": r["output_tok_s"], "elapsed_s": r["elapsed_s"],
                            "total_tok_s": r["total_tok_s"]})
            print(f"batch {bs}: {r['output_tok_s']:.1f} output tok/s")
    finally:
        llm.close()
        del llm
        gc.collect()

    meta = common.metadata(args, path, kw)
    if args.hf:
        import torch

        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from hf_baseline import build_hf_model, hf_generate

        device = kw.get("device") or ("cuda" if torch.cuda.is_available() else "cpu")
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
        dtype = our_dtype  # the same dtype as our run
        model = build_hf_model(path, kw.get("load_format") == "dummy", device, dtype, "sdpa")
        for i, (bs, row) in enumerate(zip(sizes, results)):
            row["hf_output_tok_s"] = hf_generate(model, requests(i, bs)[0], args.output_len, device)["output_tok_s"]
            print(f"batch {bs}: transformers {row['hf_output_tok_s']:.1f} output tok/s")
        del model

    result = {"benchmark": "throughput_vs_batch", **meta, "input_len": args.input_len,
              "output_len": args.output_len, "results": results}
    common.write_json(args.json_out, result)
    header = ["batch size", "output tok/s", "total tok/s", "elapsed (s)"] + (["transformers tok/s", "ratio"]
                                                                            if args.hf else [])
    rows = [[r["batch_size"], r["output_tok_s"], r["total_tok_s"], r["elapsed_s"]]
            + ([r["hf_output_tok_s"], r["output_tok_s"] / r["hf_output_tok_s"]] if args.hf else [])
            for r in results]
    common.print_table(f"throughput vs batch size: {args.model} on {meta['device_name']}, "
                       f"{args.input_len} in -> {args.output_len} out", header, rows)
    return result


if __name__ == "__main__":
    main()
