"""Qwen3's chat protocol for the demo tokenizer: its six markers as added tokens, and a chat template with
Qwen3's semantics (thinking on by default, ``enable_thinking=False`` closes an empty think block in the
generation prompt, tools listed in the system turn, calls in ``<tool_call>`` blocks, results in
``<tool_response>`` blocks of a user turn)."""

from __future__ import annotations

# NOTE: in Qwen3's order; added after the 4,000 BPE tokens they get ids 4000..4005, inside the model's vocab of
# 4032. Not special (as in Qwen3): decoding with skip_special_tokens keeps them, so text parsers see them.
MARKERS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")
FIRST_MARKER_ID = 4000

TOOLS_PREAMBLE = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                  "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
TOOLS_CODA = ("\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
              "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
              "<args-json-object>}\n</tool_call>")


def _jinja_str(text: str) -> str:
    """``text`` as a single-quoted Jinja string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


# One statement per line; the lines are joined without separators, so the template's output has no stray
# whitespace (every tag trims on both sides).
_TEMPLATE_LINES = [
    # the system turn: the tools (after the user's system text), or the system text alone
    "{%- if tools %}",
    "{{- '<|im_start|>system\\n' }}",
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}",
    "{{- " + _jinja_str(TOOLS_PREAMBLE) + " }}",
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}",
    "{{- " + _jinja_str(TOOLS_CODA) + " + '<|im_end|>\\n' }}",
    "{%- elif messages[0].role == 'system' %}",
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}",
    "{%- endif %}",
    # the last user turn that is a query (not a turn of tool results): reasoning is shown only after it
    "{%- set ns = namespace(last_query=-1) %}",
    "{%- for m in messages %}",
    "{%- if m.role == 'user' and not (m.content is string and m.content.startswith('<tool_response>')"
    " and m.content.endswith('</tool_response>')) %}{%- set ns.last_query = loop.index0 %}{%- endif %}",
    "{%- endfor %}",
    "{%- for m in messages %}",
    "{%- set content = m.content if m.content is string else '' %}",
    "{%- if m.role == 'system' and loop.first %}",
    "{%- elif m.role == 'user' or m.role == 'system' %}",
    "{{- '<|im_start|>' + m.role + '\\n' + content + '<|im_end|>\\n' }}",
    "{%- elif m.role == 'assistant' %}",
    # reasoning: the message's own field, or a think block written into its content
    "{%- set reasoning = m.reasoning_content if m.reasoning_content is string else "
    "(m.reasoning if m.reasoning is string else '') %}",
    "{%- if '</think>' in content %}",
    "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1] %}",
    "{%- set content = content.split('</think>')[-1] %}",
    "{%- endif %}",
    "{%- set content = content.lstrip('\\n') %}",
    "{{- '<|im_start|>assistant\\n' }}",
    "{%- if loop.index0 > ns.last_query and (loop.last or reasoning) %}",
    "{{- '<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' }}",
    "{%- endif %}",
    "{{- content }}",
    "{%- for call in (m.tool_calls or []) %}",
    "{%- set fn = call.function if call.function is defined else call %}",
    "{%- if content or not loop.first %}{{- '\\n' }}{%- endif %}",
    "{{- '<tool_call>\\n{\"name\": \"' + fn.name + '\", \"arguments\": ' }}",
    "{%- if fn.arguments is string %}{{- fn.arguments }}{%- else %}{{- fn.arguments | tojson }}{%- endif %}",
    "{{- '}\\n</tool_call>' }}",
    "{%- endfor %}",
    "{{- '<|im_end|>\\n' }}",
    "{%- elif m.role == 'tool' %}",
    # consecutive tool results share one user turn
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}",
    "{{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}",
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}",
    "{%- endif %}",
    "{%- endfor %}",
    "{%- if add_generation_prompt %}",
    "{{- '<|im_start|>assistant\\n' }}",
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}",
    "{%- endif %}",
]
CHAT_TEMPLATE = "".join(_TEMPLATE_LINES)


def add_markers(tokenizer) -> None:
    """Add Qwen3's six markers to the demo tokenizer as single tokens (ids 4000..4005) and set the template."""
    from tokenizers import AddedToken

    if len(tokenizer) != FIRST_MARKER_ID:
        raise ValueError(f"the tokenizer has {len(tokenizer)} tokens; the markers must start at {FIRST_MARKER_ID}")
    tokenizer.add_tokens([AddedToken(m, special=False, normalized=False) for m in MARKERS])
    ids = tokenizer.convert_tokens_to_ids(list(MARKERS))
    if ids != list(range(FIRST_MARKER_ID, FIRST_MARKER_ID + len(MARKERS))):
        raise ValueError(f"the markers got ids {ids}")
    tokenizer.chat_template = CHAT_TEMPLATE
