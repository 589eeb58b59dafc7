"""`python -m sidecar` is `vllm-sidecar`."""

import sys

from sidecar.cli import main

sys.exit(main())
