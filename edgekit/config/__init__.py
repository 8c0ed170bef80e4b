"""Typed configuration: board profiles, the board file, recipes."""
