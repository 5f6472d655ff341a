"""Structured outputs: grammars that constrain what a request may generate (see ``manager.py``)."""

from minivllm.engine.structured_output.manager import GrammarBitmask, StructuredOutputManager

__all__ = ["GrammarBitmask", "StructuredOutputManager"]
