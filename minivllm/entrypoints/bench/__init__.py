"""``minivllm bench {throughput,latency,serve}``: benchmark commands.

``commands.py`` holds the ``bench`` parser that the ``minivllm`` CLI adds (``add_bench_parser``); ``throughput``,
``latency`` and ``serve`` are the commands, ``common`` and ``models`` what they share. Without the CLI, run
``python -m minivllm.entrypoints.bench throughput ...``. Importing this package imports none of its modules (and
no torch).
"""
