"""Everything that talks to a board: SSH policy, command runners, transfer, releases, probe."""
