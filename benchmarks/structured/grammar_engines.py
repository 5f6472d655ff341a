"""xgrammar against llguidance on the host costs a grammar engine adds to serving, for the choice between them.

For each engine, with a tokenizer of Qwen3's vocabulary size (``big_tokenizer.py``) and the twenty schemas of
``tests/helpers/json_schemas.py``: the time to build its tokenizer view, to compile each schema (cold), and per token
the time to fill one row's mask and to accept the token, walking each schema with random allowed tokens; then
one batched fill of 256 rows (the engines' own parallel fill), the per-step cost the engine pays.

    python benchmarks/structured/grammar_engines.py TOKENIZER_DIR [--tokens 64] [--threads 8]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.helpers.json_schemas import SCHEMAS  # noqa: E402

VOCAB = 151_936
ROWS = 256


def allowed_ids(bitmask_row: torch.Tensor) -> list[int]:
    """The token ids a packed int32 mask row allows."""
    bits = ((bitmask_row.unsqueeze(1) >> torch.arange(32, dtype=torch.int32)) & 1).flatten()
    return bits.nonzero().flatten().tolist()


class XGrammar:
    name = "xgrammar"

    def __init__(self, tok, threads):
        import xgrammar as xgr
        self.xgr = xgr
        self.info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=VOCAB)
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=threads, cache_enabled=False)
        self.batch = xgr.BatchGrammarMatcher(max_threads=threads)

    def compile(self, schema):
        return self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)

    def matcher(self, compiled):
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, m, mask, row):
        m.fill_next_token_bitmask(mask, row)

    def accept(self, m, t):
        return m.accept_token(t)

    def done(self, m):
        return m.is_terminated()

    def fill_batch(self, ms, mask):
        self.batch.batch_fill_next_token_bitmask(ms, mask)


class LLGuidance:
    name = "llguidance"

    def __init__(self, tok, threads):
        import llguidance
        import llguidance.hf
        import llguidance.torch
        self.ll, self.llt = llguidance, llguidance.torch
        self.tok = llguidance.hf.from_tokenizer(tok, n_vocab=VOCAB)
        self.executor = llguidance.LLExecutor(threads)

    def compile(self, schema):
        grammar = self.ll.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})
        m = self.ll.LLMatcher(self.tok, grammar)
        assert not m.is_error(), m.get_error()
        return grammar

    def matcher(self, compiled):
        return self.ll.LLMatcher(self.tok, compiled)

    def fill(self, m, mask, row):
        self.llt.fill_next_token_bitmask(m, mask, row)

    def accept(self, m, t):
        return m.consume_token(t)

    def done(self, m):
        return m.is_stopped()

    def fill_batch(self, ms, mask):
        self.llt.fill_next_token_bitmask_par(self.executor, [(m, i) for i, m in enumerate(ms)], mask)


def measure(engine_cls, tok, tokens: int, threads: int, seed: int = 0) -> dict:
    t0 = time.perf_counter()
    eng = engine_cls(tok, threads)
    setup = time.perf_counter() - t0
    rng = random.Random(seed)
    compile_ms, fill_us, accept_us, compiled = [], [], [], []
    mask = torch.zeros(ROWS, (VOCAB + 31) // 32, dtype=torch.int32)
    for schema in SCHEMAS.values():
        t0 = time.perf_counter()
        c = eng.compile(schema)
        compile_ms.append((time.perf_counter() - t0) * 1e3)
        compiled.append(c)
        m = eng.matcher(c)
        for _ in range(tokens):
            if eng.done(m):
                break
            t0 = time.perf_counter()
            eng.fill(m, mask, 0)
            fill_us.append((time.perf_counter() - t0) * 1e6)
            ids = allowed_ids(mask[0])
            t = rng.choice(ids)
            t0 = time.perf_counter()
            assert eng.accept(m, t)
            accept_us.append((time.perf_counter() - t0) * 1e6)
    # 256 rows, each a schema walked a few random tokens in, filled in one batched call
    rows = []
    for i in range(ROWS):
        m = eng.matcher(compiled[i % len(compiled)])
        for _ in range(rng.randrange(0, 8)):
            eng.fill(m, mask, 0)
            ids = allowed_ids(mask[0])
            eng.accept(m, rng.choice(ids))
            if eng.done(m):  # NOTE: a finished grammar has no next mask: start the row again
                m = eng.matcher(compiled[i % len(compiled)])
        rows.append(m)
    batch_ms = []
    for _ in range(10):
        t0 = time.perf_counter()
        eng.fill_batch(rows, mask)
        batch_ms.append((time.perf_counter() - t0) * 1e3)
    fill_us.sort()
    return {"engine": eng.name, "setup_s": setup, "compile_ms_median": statistics.median(compile_ms),
            "compile_ms_max": max(compile_ms), "fill_us_median": statistics.median(fill_us),
            "fill_us_p99": fill_us[int(0.99 * (len(fill_us) - 1))], "accept_us_median": statistics.median(accept_us),
            "batch256_ms_median": statistics.median(batch_ms), "tokens": len(fill_us)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tokenizer")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--json-out")
    a = ap.parse_args()
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(a.tokenizer)
    results = [measure(cls, tok, a.tokens, a.threads) for cls in (XGrammar, LLGuidance)]
    keys = list(results[0])[1:]
    print(f"| engine | {' | '.join(keys)} |\n|---|{'---|' * len(keys)}")
    for r in results:
        print(f"| {r['engine']} | " + " | ".join(f"{r[k]:.3g}" if isinstance(r[k], float) else str(r[k])
                                              for k in keys) + " |")
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
