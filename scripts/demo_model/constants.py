"""Constants shared by the demo-model training modules."""

from __future__ import annotations

HELD_OUT_PACKAGES = ("email", "json", "xml")
EXCLUDED_DIRS = frozenset({"site-packages", "test", "tests", "idlelib", "lib2to3"})
EOS_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = (EOS_TOKEN, "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
PROMPTS = ("def fibonacci(n):", "import os\n", "class Stack:", "for i in range(")
VOCAB_MULTIPLE = 64
CALIBRATION_STEPS = (10, 30)  # time steps [10, 30) to estimate how many steps fit the time budget
PERIODIC_EVAL_WINDOWS = 32
MAX_FOLDER_MB = 40
