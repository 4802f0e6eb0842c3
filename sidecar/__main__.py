"""`python -m sidecar`: the container's entry point."""

import sys

from sidecar import main

sys.exit(main.main())
