"""Constants shared by the demo-model training modules."""

from __future__ import annotations

HELD_OUT_PACKAGES = ("email", "json", "xml")
EXCLUDED_DIRS = frozenset({"site-packages", "test", "tests", "idlelib", "lib2to3"})
EOS_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = (EOS_TOKEN, "<|im_start|>", "<|im_end|>")
# NOTE: without tools, every message renders as it did in training; with tools, as Qwen2.5 / Qwen3 render them
# (a system turn listing them, Hermes <tool_call> blocks, tool results in <tool_response>), which the engine's
# "hermes" tool-call parser reads back
CHAT_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided "
    "with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' and tools and loop.first %}"
    "{%- elif message['role'] == 'assistant' and message.get('tool_calls') %}"
    "{{- '<|im_start|>assistant' }}{%- if message.get('content') %}{{- '\\n' + message['content'] }}{%- endif %}"
    "{%- for call in message['tool_calls'] %}{%- set fn = call.get('function', call) %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + fn['name'] + '\", \"arguments\": ' + (fn['arguments'] | tojson) "
    "+ '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message['content'] + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
PROMPTS = ("def fibonacci(n):", "import os\n", "class Stack:", "for i in range(")
VOCAB_MULTIPLE = 64
CALIBRATION_STEPS = (10, 30)  # time steps [10, 30) to estimate how many steps fit the time budget
PERIODIC_EVAL_WINDOWS = 32
MAX_FOLDER_MB = 40
