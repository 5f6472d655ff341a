"""Time the batched sampler: ms per call (median) for a few parameter mixes.

    PYTHONPATH=. python benchmarks/kernels/sampler.py       # CUDA if available, else CPU
    PYTHONPATH=. python benchmarks/kernels/sampler.py --batch 256 --vocab 151936 --dtype bf16 --iters 50

Each call includes ``build_sampling_metadata`` (host work + host-to-device copies, done once per
step by the engine) and the ``Sampler`` forward, as separate columns. On CUDA the device time
is measured with CUDA events; on the CPU with ``time.perf_counter``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from minivllm.sample.metadata import build_sampling_metadata
from minivllm.sample.sampler import Sampler
from minivllm.sampling_params import SamplingParams


def scenarios(batch: int) -> dict[str, list[SamplingParams]]:
    return {
        "all-greedy": [SamplingParams(temperature=0.0) for _ in range(batch)],
        "temperature": [SamplingParams(temperature=0.8) for _ in range(batch)],
        "temperature+top_p": [SamplingParams(temperature=0.8, top_p=0.95) for _ in range(batch)],
        "top_k+top_p+penalties": [
            SamplingParams(
                temperature=0.7,
                top_k=50,
                top_p=0.9,
                repetition_penalty=1.05,
                frequency_penalty=0.2,
                presence_penalty=0.1,
            )
            for _ in range(batch)
        ],
        "mixed+8 seeded+logprobs": [
            SamplingParams(temperature=0.0)
            if i % 4 == 0
            else SamplingParams(
                temperature=0.9,
                top_p=0.9,
                seed=i if i % 32 == 1 else None,
                logprobs=5 if i % 8 == 2 else None,
            )
            for i in range(batch)
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--iters", type=int, default=0, help="timed calls per scenario (default: 50 GPU / 5 CPU)")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--fused", action="store_true", help="the Triton Gumbel-max pass for filter-free rows")
    args = ap.parse_args()

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    iters = args.iters or (50 if cuda else 5)
    B, V = args.batch, args.vocab
    if not cuda:
        print(
            f"NOTE: no CUDA; timing on the CPU ({torch.get_num_threads()} threads); numbers are not representative."
        )
    g = torch.Generator(device=device).manual_seed(0)
    logits = (torch.randn(B, V, generator=g, device=device) * 3).to(dtype)
    rng = torch.Generator().manual_seed(1)
    prompts = torch.randint(0, V, (B, args.prompt_len), generator=rng).tolist()
    outputs = torch.randint(0, V, (B, args.output_len), generator=rng).tolist()
    eos = [151645, 151643]
    sampler = Sampler(fused=args.fused)
    print(f"fused sampler: {args.fused}")

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    print(
        f"device={device} ({torch.cuda.get_device_name(device) if cuda else 'cpu'}), B={B}, V={V}, dtype={dtype}"
    )
    print(f"{'scenario':<26}{'metadata ms':>14}{'sampler ms':>14}{'total ms':>12}")
    for name, params in scenarios(B).items():
        meta_ms, samp_ms, total_ms = [], [], []
        for it in range(iters + 3):
            sync()
            t0 = time.perf_counter()
            md = build_sampling_metadata(params, prompts, outputs, eos, device, V)
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            t1 = time.perf_counter()
            out = sampler(logits, md)
            if cuda:
                end.record()
            out.sampled_token_ids.tolist()  # what the engine does: one device-to-host copy
            sync()
            t2 = time.perf_counter()
            if it >= 3:  # warm-up
                meta_ms.append((t1 - t0) * 1e3)
                samp_ms.append(start.elapsed_time(end) if cuda else (t2 - t1) * 1e3)
                total_ms.append((t2 - t0) * 1e3)
        med = statistics.median
        print(f"{name:<26}{med(meta_ms):>14.3f}{med(samp_ms):>14.3f}{med(total_ms):>12.3f}")


if __name__ == "__main__":
    main()
