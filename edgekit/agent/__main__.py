"""``cd <release> && python3 -m agent <subcommand> ...`` (the same as edgekit_agent.py)."""

import sys

from .cli import main

sys.exit(main())
