"""`python -m dispatch_fence publish|latest`: the fence's standard-library CLI (cli.main)."""

import sys

from dispatch_fence import cli

sys.exit(cli.main())
