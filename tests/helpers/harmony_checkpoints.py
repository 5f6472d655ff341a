"""A tiny gpt-oss checkpoint that chats in OpenAI's harmony format: the random tiny gpt-oss of
``gpt_oss_checkpoints.py`` with a byte-level BPE that knows harmony's special tokens, a chat template (written
here, after the format's public description) and gpt-oss's ``generation_config`` (``<|return|>`` and
``<|call|>`` end a turn).

The template renders::

    <|start|>system<|message|>...<|end|>
    <|start|>developer<|message|># Instructions ... # Tools ... namespace functions { ... }<|end|>
    <|start|>user<|message|>...<|end|>
    <|start|>assistant<|channel|>analysis<|message|>...<|end|>            (reasoning before a tool call)
    <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>
    <|start|>functions.NAME to=assistant<|channel|>commentary<|message|>...<|end|>
    <|start|>assistant<|channel|>final<|message|>...<|end|>
    <|start|>assistant                                                      (the generation prompt)
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers.checkpoints import _training_text
from tests.helpers.gpt_oss_checkpoints import build_gpt_oss_checkpoint

#: harmony's special tokens; ``<|endoftext|>`` first, so its id (0) is the one the random checkpoint's config names
HARMONY_SPECIALS = ["<|endoftext|>", "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>",
                    "<|return|>", "<|call|>"]
HARMONY_VOCAB = 384

# the TypeScript-like type of a JSON schema, as harmony writes a function's parameters
_TS_TYPE = """
{%- macro ts_type(s) -%}
{%- if s.enum is defined -%}{%- for v in s.enum -%}{{ v | tojson }}{{ ' | ' if not loop.last }}{%- endfor -%}
{%- elif s.type is defined and s.type == 'string' -%}string
{%- elif s.type is defined and s.type in ['number', 'integer'] -%}number
{%- elif s.type is defined and s.type == 'boolean' -%}boolean
{%- elif s.type is defined and s.type == 'array' -%}{{ ts_type(s['items']) if s['items'] is defined else 'any' }}[]
{%- else -%}any
{%- endif -%}
{%- endmacro -%}
"""

HARMONY_TEMPLATE = _TS_TYPE + """
{%- set first = messages[0] if messages else none -%}
{%- set has_instructions = first is not none and first.role in ['system', 'developer'] -%}
<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.
Knowledge cutoff: 2024-06

Reasoning: {{ reasoning_effort | default('medium') }}

# Valid channels: analysis, commentary, final. Channel must be included for every message.
{%- if tools %}{{ '\n' }}Calls to these tools must go to the commentary channel: 'functions'.{% endif %}<|end|>
{%- if has_instructions or tools -%}
<|start|>developer<|message|>
{%- if has_instructions %}# Instructions

{{ first.content }}
{%- if tools %}{{ '\n\n' }}{% endif %}
{%- endif %}
{%- if tools %}# Tools

## functions

namespace functions {
{% for t in tools %}{% set f = t.function %}
{%- if f.description is defined and f.description %}// {{ f.description }}
{% endif -%}
{%- set props = f.parameters.properties if f.parameters is defined and f.parameters
    and f.parameters.properties is defined else {} -%}
{%- if props %}type {{ f.name }} = (_: {
{% for name, p in props.items() %}
{%- if p.description is defined %}// {{ p.description }}
{% endif -%}
{{ name }}{{ '' if f.parameters.required is defined and name in f.parameters.required else '?' }}: {{ ts_type(p) }},
{% endfor %}}) => any;
{%- else %}type {{ f.name }} = () => any;
{%- endif %}{{ '\n\n' }}
{%- endfor %}} // namespace functions
{%- endif %}<|end|>
{%- endif -%}
{%- for m in messages -%}
{%- if loop.first and has_instructions -%}
{%- elif m.role == 'user' -%}
<|start|>user<|message|>{{ m.content }}<|end|>
{%- elif m.role == 'assistant' -%}
{%- if m.tool_calls is defined and m.tool_calls -%}
{%- if m.reasoning is defined and m.reasoning -%}
<|start|>assistant<|channel|>analysis<|message|>{{ m.reasoning }}<|end|>
{%- endif -%}
{%- if m.content -%}
<|start|>assistant<|channel|>commentary<|message|>{{ m.content }}<|end|>
{%- endif -%}
{%- for c in m.tool_calls -%}
<|start|>assistant<|channel|>commentary to=functions.{{ c.function.name }} <|constrain|>json<|message|>
{{- c.function.arguments if c.function.arguments is string else c.function.arguments | tojson }}<|call|>
{%- endfor -%}
{%- else -%}
<|start|>assistant<|channel|>final<|message|>{{ m.content }}<|end|>
{%- endif -%}
{%- elif m.role == 'tool' -%}
{%- set ns = namespace(name=m.name if m.name is defined else none) -%}
{%- for prev in messages -%}
{%- if ns.name is none and prev.tool_calls is defined and prev.tool_calls -%}
{%- for c in prev.tool_calls -%}
{%- if c.id is defined and m.tool_call_id is defined and c.id == m.tool_call_id -%}
{%- set ns.name = c.function.name -%}
{%- endif -%}
{%- endfor -%}
{%- endif -%}
{%- endfor -%}
{%- if ns.name is none -%}{{ raise_exception('a tool message must follow the call it answers') }}{%- endif -%}
<|start|>functions.{{ ns.name }} to=assistant<|channel|>commentary<|message|>{{ m.content }}<|end|>
{%- elif m.role in ['system', 'developer'] -%}
{{ raise_exception('a ' + m.role + ' message is allowed only first') }}
{%- else -%}
{{ raise_exception('unknown role ' + m.role) }}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}<|start|>assistant{%- endif -%}
"""


def build_harmony_tokenizer(out_dir: Path, vocab_size: int = HARMONY_VOCAB):
    """A byte-level BPE with harmony's special tokens and the harmony chat template, saved in ``out_dir``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=HARMONY_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_training_text() + ['{"city": "Paris", "unit": "celsius"}\n' * 20], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|return|>", pad_token="<|endoftext|>")
    fast.chat_template = HARMONY_TEMPLATE
    fast.save_pretrained(out_dir)
    return fast


def build_harmony_checkpoint(out_dir: Path, seed: int = 0) -> Path:
    """The tiny random gpt-oss with the harmony tokenizer and gpt-oss's stop tokens (``<|return|>``,
    ``<|call|>``, ``<|endoftext|>``) in its ``generation_config.json``."""
    build_gpt_oss_checkpoint(out_dir, seed=seed)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        (out_dir / name).unlink(missing_ok=True)
    tok = build_harmony_tokenizer(out_dir)
    ids = tok.convert_tokens_to_ids(["<|return|>", "<|call|>", "<|endoftext|>"])
    config = json.loads((out_dir / "config.json").read_text())
    config["eos_token_id"] = ids[0]
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    (out_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": ids, "pad_token_id": ids[2]}))
    return out_dir
