"""Per-step sampling metadata: per-row device tensors and host flags (semantics: ``minivllm.sample.sampler``)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from minivllm.config.sampling import WatermarkConfig
from minivllm.sample.token_edits import TokenEdits, bad_word_bans, build_token_edits
from minivllm.sample.watermark import context_of, is_repeated_context, keys_tensor, row_key
from minivllm.sampling_params import SamplingParams

#: temperatures below this are treated as greedy (as in vLLM), which also avoids overflow in l / T.
SAMPLING_EPS = 1e-5
_MASK63 = (1 << 63) - 1
_MASK64 = (1 << 64) - 1


@dataclass
class SamplingMetadata:
    """Device tensors and host flags for one sampling step (built by :func:`build_sampling_metadata`).

    Tensors that a flag says are unused are ``None``.
    """

    batch_size: int
    vocab_size: int
    # --- host flags (never read back from the device) ---
    all_greedy: bool
    all_random: bool
    no_temperature: bool  # every random row has temperature 1.0
    no_top_k: bool
    no_top_p: bool
    no_min_p: bool
    no_penalties: bool
    any_seeded: bool
    max_num_logprobs: int | None  # None: no row asked for top-k logprobs
    max_top_k: int  # largest enabled top_k (0 when no_top_k)
    # --- per-row device tensors ---
    greedy_mask: torch.Tensor | None = None  # [B] bool, only for mixed greedy/random batches
    temperature: torch.Tensor | None = None  # [B] float32 (1.0 on greedy rows)
    top_k: torch.Tensor | None = None  # [B] int64 (vocab_size where disabled)
    top_p: torch.Tensor | None = None  # [B] float32 (1.0 where disabled)
    min_p: torch.Tensor | None = None  # [B] float32 (0.0 where disabled)
    repetition_penalty: torch.Tensor | None = None  # [B] float32
    frequency_penalty: torch.Tensor | None = None  # [B] float32
    presence_penalty: torch.Tensor | None = None  # [B] float32
    prompt_mask: torch.Tensor | None = None  # [B, V] bool: token occurs in the prompt
    output_counts: torch.Tensor | None = None  # [B, V] float32: occurrences in the output
    banned_rows: torch.Tensor | None = None  # [M] int64  (positions to set to -inf: min_tokens, bad words)
    banned_cols: torch.Tensor | None = None  # [M] int64
    edits: TokenEdits | None = None  # logit_bias, allowed_token_ids
    grammar_rows: torch.Tensor | None = None  # [R] int64: the rows under a grammar (structured outputs)
    grammar_bitmask: torch.Tensor | None = None  # [R, ceil(V / 32)] int32: the tokens each may take, packed
    # [B, M] int64: the ids whose logprobs each row asks for (``logprob_token_ids``; 0 past a row's own, and on the
    # rows without); None: no row asks
    logprob_token_ids: torch.Tensor | None = None
    # the random rows sampled under the watermark (``sample/watermark.py``) and their 64-bit PRF keys; None: none
    watermark_rows: torch.Tensor | None = None  # [W] int64
    watermark_keys: torch.Tensor | None = None  # [W] int64
    # the rows whose token is forced (``thinking_token_budget`` ending the reasoning) and that token; None: none
    forced_rows: torch.Tensor | None = None  # [F] int64
    forced_ids: torch.Tensor | None = None  # [F] int64
    # --- randomness ---
    seeded: list[tuple[int, torch.Generator]] = field(default_factory=list)  # (row, generator)
    seeded_keys: list[tuple[int, int]] = field(default_factory=list)  # (row, 63-bit key of seed and step)
    generator: torch.Generator | None = None  # shared by the unseeded rows


def _mix_seed(seed: int, step: int) -> int:
    """splitmix64 of (seed, step): a well-spread 63-bit seed (the CPU mt19937 only uses 32 bits)."""
    z = (seed * 0x9E3779B97F4A7C15 + (step + 1) * 0xD1B54A32D192ED03) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    z ^= z >> 31
    return z & _MASK63


def seeded_keys(params: Sequence[SamplingParams], num_generated: Sequence[int]) -> list[tuple[int, int]]:
    """``(row, 63-bit key)`` of each seeded random row: the key of its seed and its tokens generated so far."""
    return [(i, _mix_seed(p.seed, n)) for i, (p, n) in enumerate(zip(params, num_generated, strict=True))
            if p.seed is not None and p.temperature >= SAMPLING_EPS]


def request_generator(seed: int, num_generated: int, device: torch.device | str) -> torch.Generator:
    """The generator a seeded request uses for its token number ``num_generated`` (0-based)."""
    return _generator(_mix_seed(seed, num_generated), device)


def _generator(key: int, device: torch.device | str) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(key)
    return g


def _to_device(data, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    t = torch.tensor(data, dtype=dtype)
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def _token_counts(rows: Sequence[Sequence[int]], vocab_size: int, device: torch.device) -> torch.Tensor:
    """[B, V] float32 counts of the ids of each row: one flat id copy, then index_add on the device."""
    batch = len(rows)
    lengths = [len(r) for r in rows]
    total = sum(lengths)
    counts = torch.zeros(batch, vocab_size, dtype=torch.float32, device=device)
    if total:
        flat = torch.from_numpy(np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=total))
        ids = flat.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else flat
        row = torch.repeat_interleave(
            torch.arange(batch, device=device), _to_device(lengths, torch.int64, device), output_size=total
        )
        valid = ((ids >= 0) & (ids < vocab_size)).to(torch.float32)  # out-of-range ids count nowhere
        counts.view(-1).index_add_(0, row * vocab_size + ids.clamp(0, vocab_size - 1), valid)
    return counts


def build_sampling_metadata(
    params: Sequence[SamplingParams],
    prompt_token_ids: Sequence[Sequence[int]],
    output_token_ids: Sequence[Sequence[int]],
    eos_token_ids: Sequence[int] | Sequence[Sequence[int]] | None,
    device: torch.device | str,
    vocab_size: int,
    generator: torch.Generator | None = None,
    grammar: tuple[Sequence[int], torch.Tensor] | None = None,
    *,
    bad_words: Sequence[Sequence[Sequence[int]]] | None = None,
    num_generated: Sequence[int] | None = None,
    penalty_tensors: tuple[torch.Tensor, torch.Tensor | None] | None = None,
    watermark: WatermarkConfig | None = None,
    forced_tokens: Sequence[int | None] | None = None,
) -> SamplingMetadata:
    """Build the per-step metadata for ``len(params)`` rows (row ``i`` = ``params[i]``).

    ``output_token_ids[i]`` are the tokens the request already generated: their count is the step number used
    for seeding and for ``min_tokens`` (unless ``num_generated`` gives the counts; ``output_token_ids[i]`` may
    then hold only the newest tokens), and their values are read by penalties (unless ``penalty_tensors``
    gives them) and by ``bad_words``. ``prompt_token_ids[i]`` are read by the repetition penalty (unless
    ``penalty_tensors``). ``eos_token_ids`` is either the model's EOS ids shared by every row
    (``[151645, 151643]``) or one list per row. ``generator`` (optional, on ``device``) is used by the unseeded
    rows; default: torch's global RNG. ``grammar``: ``(rows, bitmask)``, the packed masks (``[len(rows),
    ceil(V / 32)]`` int32, on the host) of the rows under a grammar. ``bad_words[i]``: row ``i``'s bad words as
    token ids (None: no row has any). ``penalty_tensors``: ``(output_counts [B, V] float32, prompt_mask [B, V]
    bool or None)``, kept on the device by the runner (``minivllm.sample.penalties``). ``watermark``: the
    engine's (None: none); its random rows read their context from ``output_token_ids`` (which must then hold
    ``WatermarkConfig.history()`` newest tokens, or all). ``forced_tokens[i]``: the token row ``i`` must take
    (None: free; the list None: no row has one).
    """
    device = torch.device(device)
    batch = len(params)
    if not (len(prompt_token_ids) == len(output_token_ids) == batch):
        raise ValueError("params, prompt_token_ids and output_token_ids must have the same length")
    if num_generated is None:
        num_generated = [len(out) for out in output_token_ids]
    if eos_token_ids is None:
        eos_token_ids = []
    per_row_eos = len(eos_token_ids) > 0 and not isinstance(eos_token_ids[0], int)
    if per_row_eos and len(eos_token_ids) != batch:
        raise ValueError("per-row eos_token_ids must have one entry per row")
    V = int(vocab_size)

    greedy = [p.temperature < SAMPLING_EPS for p in params]
    all_greedy = all(greedy)
    all_random = not any(greedy)
    temps = [1.0 if g else float(p.temperature) for p, g in zip(params, greedy, strict=True)]
    top_ks = [p.top_k if (not g and 0 < p.top_k < V) else V for p, g in zip(params, greedy, strict=True)]
    top_ps = [1.0 if g else float(p.top_p) for p, g in zip(params, greedy, strict=True)]
    min_ps = [0.0 if g else float(p.min_p) for p, g in zip(params, greedy, strict=True)]
    reps = [float(p.repetition_penalty) for p in params]
    freqs = [float(p.frequency_penalty) for p in params]
    press = [float(p.presence_penalty) for p in params]

    no_temperature = all(t == 1.0 for t in temps)
    no_top_k = all(k >= V for k in top_ks)
    no_top_p = all(p >= 1.0 for p in top_ps)
    no_min_p = all(m <= 0.0 for m in min_ps)
    has_rep = [r != 1.0 for r in reps]
    has_pen = [h or f != 0.0 or pr != 0.0 for h, f, pr in zip(has_rep, freqs, press, strict=True)]
    no_penalties = not any(has_pen)
    # top-k alternatives (-1: all); a row that names its ids (logprob_token_ids) gets those instead
    requested = [V if p.logprobs == -1 else p.logprobs for p in params
                 if p.logprobs is not None and not p.logprob_token_ids]
    max_num_logprobs = min(max(requested), V) if requested else None

    md = SamplingMetadata(
        batch_size=batch,
        vocab_size=V,
        all_greedy=all_greedy,
        all_random=all_random,
        no_temperature=no_temperature or all_greedy,
        no_top_k=no_top_k or all_greedy,
        no_top_p=no_top_p or all_greedy,
        no_min_p=no_min_p or all_greedy,
        no_penalties=no_penalties,
        any_seeded=False,
        max_num_logprobs=max_num_logprobs,
        max_top_k=0 if no_top_k else max(k for k in top_ks if k < V),
        generator=generator,
    )
    if not all_greedy and not all_random:
        md.greedy_mask = _to_device(greedy, torch.bool, device)
    if not md.no_temperature:
        md.temperature = _to_device(temps, torch.float32, device)
    if not md.no_top_k:
        md.top_k = _to_device(top_ks, torch.int64, device)
    if not md.no_top_p:
        md.top_p = _to_device(top_ps, torch.float32, device)
    if not md.no_min_p:
        md.min_p = _to_device(min_ps, torch.float32, device)

    if not no_penalties:
        md.repetition_penalty = _to_device(reps, torch.float32, device)
        md.frequency_penalty = _to_device(freqs, torch.float32, device)
        md.presence_penalty = _to_device(press, torch.float32, device)
        if penalty_tensors is not None:
            md.output_counts, prompt_mask = penalty_tensors
            md.prompt_mask = prompt_mask if any(has_rep) else None
        else:  # only rows with a penalty contribute ids (the others get all-zero rows)
            md.output_counts = _token_counts(
                [o if h else () for o, h in zip(output_token_ids, has_pen, strict=True)], V, device)
            if any(has_rep):
                md.prompt_mask = _token_counts(
                    [p if h else () for p, h in zip(prompt_token_ids, has_rep, strict=True)], V, device) > 0

    rows: list[int] = []
    cols: list[int] = []
    for i, (p, n) in enumerate(zip(params, num_generated, strict=True)):
        words = bad_words[i] if bad_words is not None else ()
        if not words and n >= p.min_tokens:
            continue  # the common row: nothing built
        banned = set(bad_word_bans(words, output_token_ids[i])) if words else set()
        if n < p.min_tokens:
            banned.update(p.stop_token_ids or ())
            if not p.ignore_eos:
                banned.update(eos_token_ids[i] if per_row_eos else eos_token_ids)
        banned = sorted(t for t in banned if t is not None and 0 <= t < V)
        rows.extend([i] * len(banned))
        cols.extend(banned)
    if rows:
        md.banned_rows = _to_device(rows, torch.int64, device)
        md.banned_cols = _to_device(cols, torch.int64, device)
    if any(p.logprob_token_ids for p in params):
        ids = [list(p.logprob_token_ids or ()) for p in params]
        width = max(map(len, ids))
        md.logprob_token_ids = _to_device([row + [0] * (width - len(row)) for row in ids], torch.int64, device)
    if any(p.logit_bias or p.allowed_token_ids for p in params):
        md.edits = build_token_edits(params, V, device, _to_device)

    if grammar is not None and len(grammar[0]):
        md.grammar_rows = _to_device(list(grammar[0]), torch.int64, device)
        mask = grammar[1]
        md.grammar_bitmask = (mask.pin_memory().to(device, non_blocking=True) if device.type == "cuda"
                              else mask.to(device))

    if forced_tokens is not None and any(t is not None for t in forced_tokens):
        forced = [(i, t) for i, t in enumerate(forced_tokens) if t is not None and 0 <= t < V]
        md.forced_rows = _to_device([i for i, _ in forced], torch.int64, device)
        md.forced_ids = _to_device([t for _, t in forced], torch.int64, device)
    if watermark is not None and not all_greedy:
        _add_watermark(md, watermark, params, greedy, output_token_ids, num_generated, device)
    if not all_greedy:
        md.seeded_keys = seeded_keys(params, num_generated)
        md.seeded = [(i, _generator(key, device)) for i, key in md.seeded_keys]
        md.any_seeded = bool(md.seeded)
    return md


def _add_watermark(md: SamplingMetadata, wm: WatermarkConfig, params: Sequence[SamplingParams], greedy: list[bool],
                   outputs: Sequence[Sequence[int]], num_generated: Sequence[int], device: torch.device) -> None:
    """The watermarked rows of a step and their keys: random rows that did not opt out, whose context is new."""
    rows, keys = [], []
    for i, (p, g, out, n) in enumerate(zip(params, greedy, outputs, num_generated, strict=True)):
        if g or p.watermarking is False:
            continue
        if wm.deduplicate_contexts != "none" and is_repeated_context(
                out, n, wm.context_width, wm.deduplicate_contexts_max_history):
            continue  # sampled without the watermark: its noise would repeat that position's token
        rows.append(i)
        keys.append(row_key(wm.key, context_of(out, n, wm.context_width)))
    if rows:
        md.watermark_rows = _to_device(rows, torch.int64, device)
        md.watermark_keys = keys_tensor(keys, "cpu").to(device)


def watermark_history(config: WatermarkConfig | None, params) -> int:
    """The generated tokens a request's sampling reads for the watermark of ``config`` (a ``WatermarkConfig`` or
    None); 0 when it is not watermarked: no watermark, a greedy request, or one that opted out."""
    if config is None or params.watermarking is False or params.temperature < SAMPLING_EPS:
        return 0
    return config.history()
