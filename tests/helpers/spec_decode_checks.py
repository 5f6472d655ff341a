"""Shared pieces of the speculative-decoding tests: the n-gram config, prompts whose continuations repeat what came
before (so that prompt lookup drafts and some drafts are accepted), and one SamplingParams per feature that reads
or ends a sequence."""

from __future__ import annotations

from pathlib import Path

from minivllm import LLM, SamplingParams
from tests.test_async_scheduling import assert_same_outputs

__all__ = ["DEMO_MODEL", "NGRAM", "REPETITIVE_PROMPTS", "assert_same_outputs", "feature_params"]

DEMO_MODEL = str(Path(__file__).resolve().parents[2] / "models" / "minivllm-demo-py")
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}

REPETITIVE_PROMPTS = [
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
    "for i in range(10):\n    print(i)\nfor j in range(10):\n    print(j)\nfor k in range(10):\n",
    "import os\nimport sys\nimport re\nimport json\nimport os.path\nimport",
    "class A:\n    def f(self):\n        return 1\n\nclass B:\n    def f(self):\n        return 2\n\nclass C:\n",
    "x = 1\ny = 2\nz = 3\nx = 1\ny = 2\n",
    "self.a = a\n        self.b = b\n        self.c = c\n        self.",
    "if x == 1:\n    pass\nelif x == 2:\n    pass\nelif x == 3:\n",
    "# TODO: fix this\n# TODO: fix that\n# TODO:",
    "values = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3, 4,",
    "def test_one():\n    assert f(1) == 1\n\ndef test_two():\n    assert f(2) == 2\n\ndef test_three():\n",
    "try:\n    import numpy\nexcept ImportError:\n    numpy = None\ntry:\n    import scipy\nexcept",
    "print('hello')\nprint('hello')\nprint('hel",
    "return self._name\n\n    @property\n    def size(self):\n        return self._size\n\n    @property\n    def",
    "a, b, c = 1, 2, 3\na, b, c = b, c, a\na, b, c =",
    "raise ValueError('bad value')\n    raise ValueError('bad",
    "    def __init__(self, name):\n        self.name = name\n\n    def __repr__(self):\n        return",
    "while True:\n    line = f.readline()\n    if not line:\n        break\n    lines.append(line)\n",
]


def feature_params(base: LLM) -> list[SamplingParams]:
    """One SamplingParams per prompt (the first ``len`` of ``REPETITIVE_PROMPTS``), exercising every way a sequence
    is read or ends; stop ids and strings are taken from ``base``'s greedy outputs so that they occur."""
    greedy = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    out = base.generate(REPETITIVE_PROMPTS[:8], greedy, use_tqdm=False)
    stop_id = out[1]["token_ids"][9]
    text = out[4]["text"]
    stop_str = text[len(text) // 2:len(text) // 2 + 3]
    return [
        greedy,
        SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[stop_id]),
        SamplingParams(temperature=0.8, top_p=0.9, seed=11, max_tokens=30, ignore_eos=True, logprobs=3),
        SamplingParams(temperature=0.7, repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.2,
                       seed=5, max_tokens=30, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=40, stop=[stop_str], ignore_eos=True),
        SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=24, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=30, min_tokens=14, stop_token_ids=[stop_id]),
        SamplingParams(temperature=0, max_tokens=500, ignore_eos=True, logprobs=0),  # ends at max_model_len
        SamplingParams(n=2, temperature=0, max_tokens=30, ignore_eos=True, repetition_penalty=1.2),
        SamplingParams(temperature=0.9, top_k=5, min_p=0.05, seed=7, max_tokens=30, ignore_eos=True,
                       logprob_token_ids=[1, 2, 3]),
        SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, logit_bias={13: 2.0}),
        SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, bad_words=["return"]),
        SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, prompt_logprobs=2, logprobs=2),
    ]
