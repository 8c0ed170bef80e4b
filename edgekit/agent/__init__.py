"""edgekit's board-side agent: power sampling, energy windows and board facts, on the board itself.

Pushed with every release as plain files (``<release>/agent/*.py``) and run with the board's own
python3 (JetPack 5 has 3.8): standard library only, jtop's client when jtop's service is running.

    python3 <release>/agent/edgekit_agent.py <subcommand> ...     (or: cd <release> && python3 -m agent ...)

Every sysfs/proc path is read under ``$EDGEKIT_BOARD_ROOT`` (unset → "/"), so the same code reads
a real Jetson and a simulated board. See docs/power.md.
"""

AGENT_VERSION = "1"
