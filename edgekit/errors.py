"""Errors a user can cause: each carries one clear sentence and ends the CLI with exit 2."""


class EdgekitError(Exception):
    """A problem the user can fix (bad input, unreachable host, unknown key, full disk)."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class LinkLost(EdgekitError):
    """The connection to a board broke or stalled mid-way (not a refusal by the board): worth retrying."""
