"""vLLM 0.24.0 reference figures and minivllm's targets for the named workloads.

Keys are ``(gpu, tensor_parallel_size, model, workload)``. Throughputs are output tokens/s
(higher is better); ``one-request`` is milliseconds per output token (lower is better).
H200 targets: the H100 target's margin over vLLM (about 1.2x for the
0.6B nano workload, 1.1x for the fixed batch and for 8B nano) applied to the H200 vLLM figure,
and 10% below vLLM's latency.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Reference:
    vllm: float
    target: float
    unit: str  # "tok/s" or "ms/token"
    vllm_range: tuple[float, float] | None = None
    transformers: float | None = None  # the transformers figure measured beside vLLM, when there is one

    @property
    def higher_is_better(self) -> bool:
        return self.unit != "ms/token"

    def speedup(self, ours: float) -> float:
        """> 1 means we beat vLLM (ours / vLLM for throughput, vLLM / ours for latency)."""
        if ours <= 0:
            return float("nan")
        return ours / self.vllm if self.higher_is_better else self.vllm / ours

    def met(self, ours: float) -> bool:
        return ours >= self.target if self.higher_is_better else 0 < ours <= self.target


TOKS, MS = "tok/s", "ms/token"
REFERENCES: dict[tuple[str, int, str, str], Reference] = {
    # H100 80GB, vLLM 0.24.0
    ("H100", 1, "qwen3-0.6b", "nano"): Reference(18222, 22000, TOKS),
    ("H100", 1, "qwen3-0.6b", "one-request"): Reference(1.74, 1.5, MS, vllm_range=(1.68, 1.80)),
    ("H100", 1, "qwen3-0.6b", "fixed-batch"): Reference(30066, 33000, TOKS, transformers=2968),
    ("H100", 1, "qwen3-8b", "nano"): Reference(7589, 8400, TOKS),
    ("H100", 1, "qwen3-8b", "one-request"): Reference(6.95, 6.0, MS),
    # H200, vLLM 0.24.0
    ("H200", 1, "qwen3-0.6b", "nano"): Reference(22830, round(22830 * 1.2), TOKS),
    ("H200", 1, "qwen3-0.6b", "fixed-batch"): Reference(41586, round(41586 * 1.1), TOKS),
    ("H200", 1, "qwen3-0.6b", "one-request"): Reference(1.65, round(1.65 * 0.9, 3), MS),
    ("H200", 1, "qwen3-8b", "nano"): Reference(8983, round(8983 * 1.1), TOKS),
    ("H200", 1, "qwen3-8b", "one-request"): Reference(5.26, round(5.26 * 0.9, 3), MS),
    # 2x H200, tensor parallel 2
    ("H200", 2, "qwen3-8b", "nano"): Reference(14046, 15500, TOKS),
    ("H200", 2, "qwen3-8b", "one-request"): Reference(3.78, 3.4, MS),
}


def gpu_key(device_name: str | None) -> str | None:
    """``"NVIDIA H100 80GB HBM3"`` -> ``"H100"``; None for other devices (no reference)."""
    name = (device_name or "").upper()
    for key in ("H100", "H200"):
        if key in name:
            return key
    return None


def lookup(device_name: str | None, tp: int, model: str | None, workload: str) -> Reference | None:
    gpu = gpu_key(device_name)
    if gpu is None or model is None:
        return None
    return REFERENCES.get((gpu, tp, model, workload))


def comparison_rows(ref: Reference, ours: float) -> list[list]:
    """Rows for the comparison table: ours, vLLM, speedup, target, met."""
    vllm = f"{ref.vllm:g}" + (f" ({ref.vllm_range[0]:g}-{ref.vllm_range[1]:g})" if ref.vllm_range else "")
    rows = [[f"ours ({ref.unit})", ours], [f"vLLM 0.24.0 ({ref.unit})", vllm],
            ["speedup vs vLLM (>1 better)", ref.speedup(ours)],
            [f"target ({ref.unit})", ref.target], ["target met", "yes" if ref.met(ours) else "no"]]
    if ref.transformers is not None:
        rows.insert(2, [f"transformers ({ref.unit})", ref.transformers])
        rows.insert(4, ["speedup vs transformers", ours / ref.transformers])
    return rows


def as_dict(ref: Reference, ours: float) -> dict:
    return {"vllm": ref.vllm, "vllm_range": ref.vllm_range, "transformers": ref.transformers,
            "target": ref.target, "unit": ref.unit, "ours": ours, "speedup_vs_vllm": ref.speedup(ours),
            "target_met": ref.met(ours)}
