"""The transformers baseline: a fixed-length batch through ``model.generate`` on the same device.

Default: 256 random prompts x 256 tokens -> 256 greedy tokens each (EOS ignored), the prompts
``minivllm bench throughput --workload fixed-batch`` uses. A shipped config name or a folder
without weights gives a randomly initialised model built from ``config.json`` (bf16 on GPU,
float32 on CPU unless ``--dtype``). Prints output tokens/s; with ``--ours TOKS`` or ``--run-ours``
(our fixed-batch run in-process on the same settings, after the HF model is freed) also ours
and the ratio.

    python benchmarks/engine/hf_baseline.py --model qwen3-0.6b --run-ours --json-out runs/hf_0.6b.json
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))

from reference import lookup  # noqa: E402

from minivllm.entrypoints.bench import common, throughput  # noqa: E402


def build_hf_model(path: str, dummy: bool, device: str, dtype: str, attn: str):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch_dtype = getattr(torch, dtype)
    if dummy:
        cfg = AutoConfig.from_pretrained(path)
        torch.manual_seed(0)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch_dtype, attn_implementation=attn)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, attn_implementation=attn).to(device)
    model.eval()
    gc_ = model.generation_config
    gc_.eos_token_id = None  # ignore EOS: every row generates exactly --output-len tokens
    gc_.pad_token_id = 0
    gc_.do_sample, gc_.temperature, gc_.top_p, gc_.top_k = False, None, None, None
    return model


def hf_generate(model, prompts: list[list[int]], output_len: int, device: str) -> dict:
    import torch

    ids = torch.tensor(prompts, device=device)
    mask = torch.ones_like(ids)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    with torch.inference_mode():
        model.generate(ids[:2, :16], attention_mask=mask[:2, :16], max_new_tokens=4)  # warm-up
        sync()
        t0 = time.perf_counter()
        out = model.generate(ids, attention_mask=mask, max_new_tokens=output_len, min_new_tokens=output_len)
        sync()
        elapsed = time.perf_counter() - t0
    n_out = (out.shape[1] - ids.shape[1]) * ids.shape[0]
    return {"elapsed_s": elapsed, "output_tokens": n_out, "output_tok_s": n_out / elapsed}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--attn-implementation", default="sdpa")
    p.add_argument("--ours", type=float, default=None, help="our output tok/s, to print the ratio")
    p.add_argument("--run-ours", action="store_true", help="also run our fixed-batch benchmark in-process")
    common.add_engine_args(p)
    args = p.parse_args(argv)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = args.dtype or ("bfloat16" if device.startswith("cuda") else "float32")
    path, kw = common.engine_kwargs(args)
    dummy = kw.get("load_format") == "dummy"
    spec = dict(throughput.WORKLOADS["fixed-batch"], num_requests=args.batch_size, min_input_len=args.input_len,
                max_input_len=args.input_len, min_output_len=args.output_len, max_output_len=args.output_len)
    prompts, _ = throughput.make_requests(spec, args.seed, common.vocab_limit(path))

    model = build_hf_model(path, dummy, device, dtype, args.attn_implementation)
    hf = hf_generate(model, prompts, args.output_len, device)
    del model
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()

    ours, ours_result = args.ours, None
    if args.run_ours:
        argv2 = ["--workload", "fixed-batch", "--num-requests", str(args.batch_size), "--input-len",
                 str(args.input_len), "--output-len", str(args.output_len), "--model", args.model,
                 "--seed", str(args.seed), "--device", device, "--dtype", dtype]
        for name, value in kw.items():  # the engine arguments of this command line, passed on as they are
            if name not in ("device", "dtype"):
                argv2 += ["--engine-arg", f"{name}={value!r}"]
        ours_result = throughput.main(argv2)
        ours = ours_result["output_tok_s"]

    meta = common.metadata(args, path, dict(kw, device=device, dtype=dtype))
    ref = lookup(meta["device_name"], 1, meta["model_name"], "fixed-batch")
    default_sizes = (args.batch_size, args.input_len, args.output_len) == (256, 256, 256)
    result = {"benchmark": "hf_baseline", **meta, "batch_size": args.batch_size, "input_len": args.input_len,
              "output_len": args.output_len, "dtype": dtype, "attn_implementation": args.attn_implementation,
              "hf_elapsed_s": hf["elapsed_s"], "hf_output_tokens": hf["output_tokens"],
              "hf_output_tok_s": hf["output_tok_s"], "ours_output_tok_s": ours,
              "ratio": ours / hf["output_tok_s"] if ours else None, "ours_result": ours_result}
    common.write_json(args.json_out, result)
    import transformers

    rows = [["model", args.model], ["device / dtype", f"{meta['device_name']} / {dtype}"],
            ["batch x input -> output", f"{args.batch_size} x {args.input_len} -> {args.output_len}"],
            [f"transformers {transformers.__version__} output tok/s", hf["output_tok_s"]]]
    if ours:
        rows += [["minivllm output tok/s", ours], ["ratio minivllm / transformers", result["ratio"]]]
    if ref is not None and ref.transformers and default_sizes:
        rows += [["reference: transformers (tok/s)", ref.transformers], ["reference: vLLM 0.24.0 (tok/s)", ref.vllm]]
    common.print_table("transformers baseline", ["metric", "value"], rows)
    return result


if __name__ == "__main__":
    main()
