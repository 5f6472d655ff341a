"""The OpenAI handlers of the server: completions and chat completions on one engine client."""

from __future__ import annotations

from minivllm.entrypoints.openai.serving_chat import ChatServing
from minivllm.entrypoints.openai.serving_completion import CompletionServing


class OpenAIServing(CompletionServing, ChatServing):
    """Serves ``/v1/completions`` (``completions``) and ``/v1/chat/completions`` (``chat``) under one model name,
    with one tokenizer off the event loop."""
