"""``python -m minivllm.entrypoints.bench {throughput,latency,serve} ...`` (the same as ``minivllm bench``)."""

import sys

from minivllm.entrypoints.bench.commands import main

sys.exit(main())
