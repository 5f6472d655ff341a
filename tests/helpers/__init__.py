"""Modules the tests share (not tests themselves); fixtures are in tests/conftest.py."""
