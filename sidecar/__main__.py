"""`python -m sidecar`: the container's entry point."""

import os
import sys

from sidecar import main

# `--started` is the startupProbe's question; anything else runs the verifier.
sys.exit(main.started(dict(os.environ)) if sys.argv[1:] == ["--started"] else main.main())
