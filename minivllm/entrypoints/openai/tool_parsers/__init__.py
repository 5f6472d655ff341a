"""Tool-call parsers: find function calls in a model's output text, whole (``extract``) or as it streams
(``streamer``), for the OpenAI-compatible chat API. Pure Python: no torch, no tokenizer."""

from minivllm.entrypoints.openai.tool_parsers.base import ToolCall, ToolCallDelta, ToolParser, ToolStreamer
from minivllm.entrypoints.openai.tool_parsers.hermes import HermesToolParser
from minivllm.entrypoints.openai.tool_parsers.llama3_json import Llama3JsonToolParser
from minivllm.entrypoints.openai.tool_parsers.openai import OpenAIToolParser

#: ``--tool-call-parser`` names (vLLM's) to parser classes
TOOL_PARSERS: dict[str, type[ToolParser]] = {"hermes": HermesToolParser, "llama3_json": Llama3JsonToolParser,
                                              "openai": OpenAIToolParser}

__all__ = ["TOOL_PARSERS", "HermesToolParser", "Llama3JsonToolParser", "OpenAIToolParser", "ToolCall",
           "ToolCallDelta", "ToolParser", "ToolStreamer"]
