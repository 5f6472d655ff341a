"""``GET /tokenizer_info`` (vLLM's route, served only with ``--enable-tokenizer-info-endpoint``: it shows the chat
template and the tokenizer's settings): what a client needs to tokenize as the server does, in vLLM's shape, the
tokenizer's own settings (its ``tokenizer_config.json`` as loaded) with its class name and chat template."""

from __future__ import annotations

from tokenizers import AddedToken

from minivllm.entrypoints.openai.errors import APIError

# the paths of the tokenizer's files on the server's disk: nothing a client can use
_FILE_FIELDS = ("vocab_file", "merges_file")


def tokenizer_info_of(tokenizer) -> dict:
    """The tokenizer's settings as JSON (special tokens as their text), ``tokenizer_class`` and ``chat_template``;
    a 400 for a server without a tokenizer (``--skip-tokenizer-init``)."""
    if tokenizer is None:
        raise APIError(400, "this server has no tokenizer (--skip-tokenizer-init): it has no tokenizer info")
    info = {k: _json_of(v) for k, v in (getattr(tokenizer, "init_kwargs", None) or {}).items()
            if k not in _FILE_FIELDS}
    info["tokenizer_class"] = type(tokenizer).__name__
    template = getattr(tokenizer, "chat_template", None)
    if template:
        info["chat_template"] = template
    return info


def _json_of(value):
    """A setting as JSON: a special token (``AddedToken``) as its text, containers item by item, other objects as
    text."""
    if isinstance(value, AddedToken):
        return value.content
    if isinstance(value, dict):
        return {str(k): _json_of(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_of(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)
