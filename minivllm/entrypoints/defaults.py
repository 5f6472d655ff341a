"""Defaults of the command line: the demo model the repository's scripts train."""

from __future__ import annotations

from pathlib import Path

#: ``<repo>/models/minivllm-demo-py`` (made by ``scripts/train_demo_model.py``; may not exist yet).
DEFAULT_MODEL = str(Path(__file__).resolve().parents[2] / "models" / "minivllm-demo-py")
