"""``python -m mineru_health`` is the ``mineru-health`` command."""

from .cli import main

raise SystemExit(main())
