"""Profile engine steps on a GPU: host time per phase, kernel time by name, idle gaps.

    PYTHONPATH=. python benchmarks/engine/profile_step.py --model qwen3-0.6b

Phases are timed with host clocks around each part of ``LLMEngine.step``; kernels come from
``torch.profiler``. Prints one table per scenario: one request decoding, and 256 requests from
admission. By default the engine runs as configured (asynchronous scheduling on a GPU): the
host phases then overlap the device, "launch" is the host time to enqueue a step, and "wait for
tokens" is the time the host idles until the previous step's tokens arrive. ``--sync-phases``
turns asynchronous scheduling off and synchronizes after the device phases (their time then
includes the GPU work they launched).

    PYTHONPATH=. python benchmarks/engine/profile_step.py --model ... --tp 2 --decode-rows 8 48 112 240

``--decode-rows``: for each count, that many requests decoding together after ``--decode-context``
prompt tokens; 30 steps' kernel time (rank 0) by category: GEMM, attention, all-reduce, norm, sampling,
other.
"""

from __future__ import annotations

import argparse
import random
import time
from collections import Counter, defaultdict

import torch

from minivllm import LLM, SamplingParams
from minivllm.entrypoints.bench.models import resolve_model  # noqa: E402
from minivllm.worker import model_runner as mr


class PhaseTimer:
    """Wraps methods so each call adds its wall time to a named bucket; ``restore`` undoes it."""

    def __init__(self):
        self.total = defaultdict(float)
        self.calls = defaultdict(int)
        self.originals = []

    def wrap(self, obj, name: str, label: str, sync: bool = False):
        fn = getattr(obj, name)
        self.originals.append((obj, name, obj.__dict__.get(name)))

        def timed(*a, **k):
            t = time.perf_counter()
            r = fn(*a, **k)
            if sync and torch.cuda.is_available():
                torch.cuda.synchronize()
            self.total[label] += time.perf_counter() - t
            self.calls[label] += 1
            return r

        setattr(obj, name, timed)

    def restore(self) -> None:
        for obj, name, original in reversed(self.originals):
            if original is None:
                delattr(obj, name)
            else:
                setattr(obj, name, original)
        self.originals = []


def instrument(llm: LLM, sync: bool) -> PhaseTimer:
    pt = PhaseTimer()
    runner = llm.engine.executor.runner
    pt.wrap(llm.engine.scheduler, "schedule", "schedule")
    pt.wrap(runner.batch, "prepare_inputs", "prepare inputs")
    pt.wrap(runner, "execute", "forward" + (" (GPU)" if sync else " (enqueue)"), sync=sync)
    pt.wrap(runner, "_sample", "sample" + (" (GPU)" if sync else " (enqueue)"), sync=sync)
    pt.wrap(runner, "_sample_sharded", "sample" + (" (GPU)" if sync else " (enqueue)"), sync=sync)
    pt.wrap(mr.StepHandle, "result", "wait for tokens")
    pt.wrap(llm.engine.scheduler, "update_from_output", "update from output (scheduler)")
    pt.wrap(llm.engine, "_snapshot", "outputs / detokenize")
    pt.wrap(llm.engine, "step", "whole step")
    return pt


def report(title: str, pt: PhaseTimer, steps: int) -> None:
    print(f"\n## {title}: {steps} steps")
    whole = pt.total["whole step"]
    print(f"{'phase':<24}{'ms/step':>10}{'share':>8}")
    for label, t in sorted(pt.total.items(), key=lambda x: -x[1]):
        print(f"{label:<24}{1000 * t / steps:>10.3f}{100 * t / whole:>7.1f}%")
    other = whole - sum(t for k, t in pt.total.items() if k != "whole step")
    print(f"{'(engine glue)':<24}{1000 * other / steps:>10.3f}{100 * other / whole:>7.1f}%")


def collective_spread(prof, steps: int) -> None:
    """Duration spread of the collectives' kernels: a mean far above the median is waiting for a
    late rank (the kernel spins until every rank arrives), not moving data."""
    by_name: dict[str, list[float]] = {}
    starts: dict[str, list[tuple[float, float]]] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and any(
                k in e.name for k in ("all_reduce", "AllReduce", "Broadcast", "SendRecv")):
            by_name.setdefault(e.name[:48], []).append(e.time_range.elapsed_us())
            starts.setdefault(e.name[:48], []).append((e.time_range.start, e.time_range.elapsed_us()))
    print(f"{'collective kernel':<50}{'calls':>7}{'median us':>11}{'mean us':>9}{'p99 us':>9}"
          f"{'max us':>9}{'> 4x median, ms/step':>22}")
    for name, d in sorted(by_name.items(), key=lambda kv: -sum(kv[1])):
        d.sort()
        med = d[len(d) // 2]
        slow = sum(x - med for x in d if x > 4 * med) / 1000 / steps
        print(f"{name:<50}{len(d):>7}{med:>11.2f}{sum(d) / len(d):>9.2f}{d[int(0.99 * (len(d) - 1))]:>9.1f}"
              f"{d[-1]:>9.1f}{slow:>22.3f}")
        if len(d) % steps == 0 and len(d) > steps:  # the same calls every step: which of them wait
            per = len(d) // steps
            ordered = sorted(starts[name])
            where = Counter(i % per for i, (_, us) in enumerate(ordered) if us > 4 * med)
            print(f"    slow calls by position in the step's {per} (position: count): {dict(where.most_common(6))}")


CATEGORIES = (("GEMM", ("nvjet", "gemm", "gemv", "cutlass", "sm90_xmma", "aten::mm")),
              ("attention", ("attention", "decode_kernel", "split_kv")),
              ("all-reduce", ("all_reduce", "AllReduce")),
              ("norm", ("norm",)),
              ("sampling", ("gumbel", "sample", "argmax", "Gather", "Broadcast", "SendRecv")))


def kernel_categories(prof, steps: int) -> None:
    """GPU time a step by kind of kernel (rank 0), then the largest kernels of the rest."""
    per_cat: dict[str, float] = defaultdict(float)
    other: dict[str, float] = defaultdict(float)
    for e in prof.key_averages():
        t = e.self_device_time_total / 1000 / steps  # ms a step
        if t <= 0 or e.key.startswith("aten::"):
            continue
        cat = next((c for c, keys in CATEGORIES if any(k in e.key for k in keys)), None)
        if cat is None:
            other[e.key[:60]] += t
        else:
            per_cat[cat] += t
    per_cat["other"] = sum(other.values())
    print(f"{'kernels':<16}{'ms/step':>9}   " + "  ".join(f"{c} {t:.3f}" for c, t in per_cat.items())
          + f"   total {sum(per_cat.values()):.3f}")
    for name, t in sorted(other.items(), key=lambda kv: -kv[1])[:6]:
        print(f"    other: {name:<60}{t:>8.3f} ms/step")


def run_decode_batch(llm: LLM, rows: int, context: int, steps: int = 30) -> None:
    """``rows`` requests of ``context`` prompt tokens, all decoding; ``steps`` decode steps profiled."""
    vocab = min(10000, llm.engine.config.model_config.arch.vocab_size - 1)
    for _ in range(rows):
        llm.engine.add_request([random.randint(0, vocab) for _ in range(context)],
                        SamplingParams(temperature=0.6, max_tokens=2 * steps + 40, ignore_eos=True))
    while any(s.num_completion_tokens < 2 for s in llm.engine.scheduler.running) or llm.engine.scheduler.waiting:
        llm.engine.step()
    for _ in range(5):
        llm.engine.step()
    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        llm.engine.step()
    sync()
    plain = (time.perf_counter() - t0) * 1000 / steps
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA if cuda
                                              else torch.profiler.ProfilerActivity.CPU])
    sync()
    t0 = time.perf_counter()
    with prof:
        for _ in range(steps):
            llm.engine.step()
        sync()
    wall = (time.perf_counter() - t0) * 1000 / steps
    print(f"\n## decode, {rows} rows, context ~{context}: wall {plain:.3f} ms/step ({wall:.3f} profiled)")
    kernel_categories(prof, steps)
    while llm.engine.has_unfinished_requests():
        llm.engine.step()


def run_scenario(llm: LLM, prompts, params, title: str, profile_kernels: bool, sync: bool) -> None:
    for p, sp in zip(prompts, params):
        llm.engine.add_request(p, sp)
    for _ in range(3):  # admit + prefill outside the decode measurement
        llm.engine.step()
    pt = instrument(llm, sync)
    steps = 0
    prof = None
    if profile_kernels:
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                  torch.profiler.ProfilerActivity.CUDA])
        prof.__enter__()
    t0 = time.perf_counter()
    while llm.engine.has_unfinished_requests() and steps < 200:
        llm.engine.step()
        steps += 1
    wall = time.perf_counter() - t0
    if prof is not None:
        prof.__exit__(None, None, None)
    pt.restore()
    report(title, pt, steps)
    print(f"wall {1000 * wall / steps:.3f} ms/step")
    if prof is not None:
        events = prof.key_averages()
        gpu_total = sum(e.self_device_time_total for e in events) / 1000
        print(f"GPU busy {gpu_total / steps:.3f} ms/step of {1000 * wall / steps:.3f} ms/step wall "
              f"(idle {100 * (1 - gpu_total / 1000 / wall):.0f}%; profiler overhead inflates wall)")
        print(events.table(sort_by="self_device_time_total", row_limit=15, max_name_column_width=60))
        collective_spread(prof, steps)
    while llm.engine.has_unfinished_requests():
        llm.engine.step()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen3-0.6b", help="a checkpoint folder or a shipped config name")
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--no-kernels", action="store_true", help="skip the torch.profiler kernel table")
    ap.add_argument("--load-format", default="dummy")
    ap.add_argument("--device", default=None)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--tp", type=int, default=1, help="tensor_parallel_size (kernels: rank 0's GPU)")
    ap.add_argument("--sync-phases", action="store_true",
                    help="asynchronous scheduling off, a synchronize after each device phase")
    ap.add_argument("--decode-rows", type=int, nargs="*", default=None,
                    help="instead of the two scenarios: decode batches of these many rows, by kernel category")
    ap.add_argument("--decode-context", type=int, default=1000)
    ap.add_argument("--quantization", choices=("fp8",), default=None, help="FP8 weights, quantized when loaded")
    args = ap.parse_args()
    args.model = resolve_model(args.model)[0]
    llm = LLM(args.model, load_format=args.load_format, max_model_len=args.max_model_len,
              enforce_eager=args.enforce_eager, device=args.device, tensor_parallel_size=args.tp,
              quantization=args.quantization, **({"async_scheduling": False} if args.sync_phases else {}))
    print(f"async_scheduling={llm.engine.config.scheduler_config.async_scheduling}")
    llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4), use_tqdm=False)
    random.seed(0)
    if args.decode_rows:
        for rows in args.decode_rows:
            run_decode_batch(llm, rows, args.decode_context)
        return
    one = [[random.randint(0, min(10000, llm.engine.config.model_config.arch.vocab_size - 1)) for _ in range(128)]]
    run_scenario(llm, one, [SamplingParams(temperature=0, max_tokens=300, ignore_eos=True)],
                 "one request, decode", not args.no_kernels, args.sync_phases)
    batch = [[random.randint(0, min(10000, llm.engine.config.model_config.arch.vocab_size - 1)) for _ in range(random.randint(100, 1024))] for _ in range(256)]
    params = [SamplingParams(temperature=0.6, max_tokens=300, ignore_eos=True) for _ in batch]
    run_scenario(llm, batch, params, "256 requests (nano-like), from admission", not args.no_kernels,
                 args.sync_phases)


if __name__ == "__main__":
    main()
