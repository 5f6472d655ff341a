"""One rank's shapes as a model of its own: time what a tensor-parallel rank computes, on one GPU.

At ``tensor_parallel_size=k`` each rank holds 1/k of the query heads, of the MLP (of every expert's intermediate
dimension in a mixture of experts, all experts on every rank) and of the vocabulary, and ``max(1, kv_heads / k)``
KV heads (replicated when there are fewer than ranks). A config with those
shapes, run at TP=1, does a rank's compute with no all-reduces, no waits for the other ranks and no
broadcast of the step's inputs; the TP=k run's extra time over it is what tensor parallelism costs.
``tp_scaling.py --rank-proxy`` runs it next to each TP size and prints :func:`overhead_table`.

The proxy samples from its own 1/k of the vocabulary, as each rank does with sharded sampling; its
token ids are not the real model's (dummy weights: the timing does not depend on them).
"""

from __future__ import annotations

import json
from pathlib import Path


def rank_config(config: dict, tp: int) -> dict:
    """The ``config.json`` dict of one rank's shapes at ``tp`` ranks (the model's own config otherwise)."""
    heads, kv_heads = config["num_attention_heads"], config.get("num_key_value_heads", config["num_attention_heads"])
    inter, vocab = config["intermediate_size"], config["vocab_size"]
    # Qwen3-MoE's experts have their own size (Mixtral's and OLMoE's are ``intermediate_size``)
    split = {"num_attention_heads": heads, "intermediate_size": inter, "vocab_size": vocab,
             **({"moe_intermediate_size": config["moe_intermediate_size"]} if config.get("moe_intermediate_size")
                else {})}
    for name, n in split.items():
        if n % tp:
            raise ValueError(f"{name} = {n} does not split over {tp} ranks")
    if kv_heads >= tp and kv_heads % tp:
        raise ValueError(f"num_key_value_heads = {kv_heads} does not split over {tp} ranks")
    out = dict(config)
    out.update({name: n // tp for name, n in split.items()})
    out.update(num_key_value_heads=max(1, kv_heads // tp), bos_token_id=vocab // tp - 2,
               eos_token_id=vocab // tp - 1)
    if "head_dim" not in config:  # NOTE: the HF default derives it from hidden / heads, which changed
        out["head_dim"] = config["hidden_size"] // heads
    out["_note"] = (f"not a real model: one rank's shapes at tensor_parallel_size={tp} "
                    f"(benchmarks/engine/rank_proxy.py)")
    return out


def write_rank_config(model_dir: str, tp: int, out_dir: str) -> str:
    """Write :func:`rank_config` of ``model_dir``'s ``config.json`` to ``out_dir``; returns ``out_dir``."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    (Path(out_dir) / "config.json").write_text(json.dumps(rank_config(config, tp), indent=2))
    return out_dir


def overhead_table(tp_row: dict, proxy_row: dict) -> str:
    """Seconds per step kind of a TP run (``tp_scaling.measure``'s result) against its rank proxy's."""
    proxy = {r["kind"]: r for r in proxy_row["step_breakdown"]}
    lines = [f"TP={tp_row['tp']} against one rank's compute (its rank proxy at TP=1)",
             f"{'steps':<22} {'count':>6} {'TP s':>8} {'proxy s':>8} {'extra s':>8} {'ms/step':>8}"]
    for r in tp_row["step_breakdown"]:
        p = proxy.get(r["kind"])
        if p is None:
            lines.append(f"{r['kind']:<22} {r['steps']:>6} {r['seconds']:>8.3f} {'-':>8}")
            continue
        extra = r["seconds"] - p["seconds"]
        lines.append(f"{r['kind']:<22} {r['steps']:>6} {r['seconds']:>8.3f} {p['seconds']:>8.3f} {extra:>8.3f} "
                     f"{1000 * extra / r['steps']:>8.2f}")
    total, ptotal = tp_row["throughput_elapsed_s"], proxy_row["throughput_elapsed_s"]
    lines.append(f"{'whole run':<22} {'':>6} {total:>8.3f} {ptotal:>8.3f} {total - ptotal:>8.3f}")
    return "\n".join(lines)
