"""Greedy references from Hugging Face transformers, one prompt at a time (no padding).

Every reference is computed once per test session (per pytest process): the models and the generations are
cached, by (path, prompt token ids, number of new tokens) for ``hf_greedy``.
"""

from functools import cache, lru_cache

import torch


@lru_cache(maxsize=4)
def _hf_model(path: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@cache
def _hf_greedy(path: str, prompt_ids: tuple[int, ...], max_new_tokens: int) -> tuple[int, ...]:
    model = _hf_model(path)
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             min_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
    return tuple(out[0, len(prompt_ids):].tolist())


def hf_greedy(path: str, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """transformers' greedy ``max_new_tokens`` tokens after ``prompt_ids`` (float32; cached)."""
    return list(_hf_greedy(str(path), tuple(prompt_ids), max_new_tokens))


def hf_logits(path: str, token_ids: list[int]) -> torch.Tensor:
    """Logits [len, vocab] of the full sequence."""
    model = _hf_model(path)
    with torch.no_grad():
        return model(torch.tensor([token_ids])).logits[0].float()


def near_tie_gaps(path: str, prompts: list[list[int]], outs: list[list[int]]) -> list[float]:
    """For each token an engine picked after each prompt, teacher-forced through transformers in float32: how far
    below that step's best logit its logit is, in standard deviations of the step's logits (0: the best token)."""
    gaps: list[float] = []
    for prompt, out in zip(prompts, outs):
        logits = hf_logits(path, list(prompt) + list(out))[len(prompt) - 1:-1]  # [steps, vocab]: each pick's
        chosen = logits.gather(1, torch.tensor(out)[:, None])[:, 0]  # [steps]
        gaps += ((logits.max(1).values - chosen) / logits.std(1)).tolist()
    return gaps


def router_near_tie_steps(path: str, prompts: list[list[int]], outs: list[list[int]],
                          eps: float = 1e-3) -> list[bool]:
    """For each pick, in ``near_tie_gaps``' order: whether a mixture-of-experts router, at the pick's position or
    before it, had its ``top_k``-th and next expert within ``eps`` (router logits) in transformers' float32 run
    on the same tokens. There another order of float32 sums can pick the other expert, which changes that
    position's hidden state and, through attention, every later logit of the sequence."""
    model = _hf_model(path)
    k = model.config.num_experts_per_tok
    flags: list[bool] = []
    for prompt, out in zip(prompts, outs):
        with torch.no_grad():
            routers = model(torch.tensor([list(prompt) + list(out)]), output_router_logits=True).router_logits
        top = [r.float().topk(k + 1, dim=-1).values for r in routers]  # per MoE layer [len, k + 1]
        margin = torch.stack([t[:, k - 1] - t[:, k] for t in top]).min(0).values  # [len]
        flags += (torch.cummin(margin, 0).values < eps)[len(prompt) - 1:-1].tolist()
    return flags
