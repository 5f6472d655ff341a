"""Pieces of ``scripts/train_demo_model.py`` (the demo model's training), one idea per module."""
