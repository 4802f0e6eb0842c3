"""`python -m dispatch_fence publish|latest`: the fence's standard-library CLI (checkpoint.main)."""

import sys

from dispatch_fence import checkpoint

sys.exit(checkpoint.main())
