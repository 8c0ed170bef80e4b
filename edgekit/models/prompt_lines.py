"""The prompt-file format (one prompt a line) shared by alignment and the text-tuned tiny models."""

from __future__ import annotations


def parse_prompts(text: str) -> list[str]:
    """One prompt per line; blank lines and lines starting with '#' are skipped; '\\n' escapes a newline."""
    out = []
    for line in text.splitlines():
        s = line.strip()
        if s and not s.startswith("#"):
            out.append(s.replace("\\n", "\n"))
    return out
