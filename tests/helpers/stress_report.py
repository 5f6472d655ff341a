"""Where the server stress suite leaves its figures for pytest's terminal summary (conftest.py). Imports only
pytest, so the hook works where the server's test dependencies are not installed (the GPU machines)."""

import pytest

#: the stress suite's figures, one line each
REPORT = pytest.StashKey[list]()
