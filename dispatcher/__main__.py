"""`python -m dispatcher`: configuration from the environment only."""

import sys

from dispatcher import app

sys.exit(app.main())
