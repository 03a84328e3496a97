#!/usr/bin/env python3
"""TensorRT-LLM's examples/quantization/quantize.py in the sandbox's image: writes a checkpoint.

python3 in a sandbox container is the sandbox's own Python, so the stand-in lives in
llmfleet_sandbox.build_tools (unit-tested there).
"""

import sys

from llmfleet_sandbox.build_tools import quantize_main

sys.exit(quantize_main())
