"""``python -m mineru_health.demo``: the same as ``mineru-health demo``."""

import sys

from . import main

sys.exit(main())
