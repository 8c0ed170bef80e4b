"""Run a build step with its full output in a log, a one-line progress, and a short error.

ninja prints `[n/m] Building CXX object ...` per edge when its output is not a terminal; that
count drives the progress line. On failure the user gets the first compiler or CMake error with
a little context, not thousands of lines; the whole log stays in the build directory.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

NINJA_LINE = re.compile(r"^\[(\d+)/(\d+)\]\s+(.*)$")
_ERROR = re.compile(
    r"(\berror\b\s*:|\berror\b\s+[A-Z]\d+|fatal error|undefined reference|cannot find -l|CMake Error"
    r"|No such file or directory|Killed signal|internal compiler error|\bld returned\b)",
    re.IGNORECASE,
)
_NOISE = re.compile(r"^(ninja: build stopped|ninja: error: rebuilding|\[\d+/\d+\])")
MAX_ERROR_LINES = 12
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # llama.cpp builds with -fdiagnostics-color=always


def parse_progress(line: str) -> tuple[int, int, str] | None:
    match = NINJA_LINE.match(line)
    return (int(match.group(1)), int(match.group(2)), match.group(3)) if match else None


def last_error(log_text: str) -> str:
    """The first error of the failing step (with its location and a few lines), else the tail."""
    lines = _ANSI.sub("", log_text).splitlines()
    failed = [i for i, ln in enumerate(lines) if ln.startswith("FAILED: ")]
    start = failed[0] if failed else 0
    for i in range(start, len(lines)):
        if _ERROR.search(lines[i]) and not _NOISE.match(lines[i]):
            block = [lines[i]]
            for ln in lines[i + 1:i + MAX_ERROR_LINES]:
                if not ln.strip() or _NOISE.match(ln) or ln.startswith("FAILED: "):
                    break
                block.append(ln)
            head = [f"in {_short_failed(lines[start])}"] if failed else []
            return "\n".join(head + block)
    tail = [ln for ln in lines if ln.strip() and not _NOISE.match(ln)]
    return "\n".join(tail[-MAX_ERROR_LINES:])


def _short_failed(line: str) -> str:
    """`FAILED: path/to/x.cu.o ...` → the object being built."""
    parts = line.removeprefix("FAILED: ").split()
    return parts[0] if parts else line


class StepFailed(Exception):
    def __init__(self, step: str, code: int, error: str) -> None:
        super().__init__(f"{step} failed (exit {code})")
        self.step, self.code, self.error = step, code, error


def run_step(step: str, argv: Sequence[str], log: TextIO, env: Mapping[str, str] | None = None,
             on_line: Callable[[str], None] | None = None, cwd: Path | None = None) -> float:
    """Run ``argv`` with stdout+stderr into ``log``; raise StepFailed with the first error."""
    log.write(f"\n$ {' '.join(argv)}\n")
    log.flush()
    start = time.monotonic()
    captured: list[str] = []
    with subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace", env=dict(env) if env else None, cwd=cwd, bufsize=1) as proc:
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                log.write(line)
                captured.append(line)
                if on_line:
                    on_line(line.rstrip("\n"))
        except BaseException:
            proc.kill()  # Ctrl-C or a failing callback: never leave a compiler running
            raise
        code = proc.wait()
    log.flush()
    if code != 0:
        raise StepFailed(step, code, last_error("".join(captured)))
    return time.monotonic() - start


class BuildProgress:
    """A rich progress line fed by ninja's [n/m] lines; silent when output is not for people."""

    def __init__(self, console: Console | None, label: str) -> None:
        self.progress = Progress(
            TextColumn("[bold]{task.fields[label]}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[what]}", style="dim"), TimeElapsedColumn(),
            console=console, transient=True, disable=console is None,
        )
        self.task = self.progress.add_task("build", total=None, label=label, what="configuring")

    def step(self, what: str) -> None:
        self.progress.update(self.task, what=what)

    def on_line(self, line: str) -> None:
        parsed = parse_progress(line)
        if parsed:
            n, m, desc = parsed
            self.progress.update(self.task, completed=n, total=m, what=_short_desc(desc))

    def __enter__(self) -> BuildProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()


def _short_desc(desc: str) -> str:
    """`Building CXX object ggml/src/CMakeFiles/ggml-base.dir/ggml.c.o` → `ggml.c`."""
    words = desc.split()
    obj = words[-1] if words else desc
    name = obj.rsplit("/", 1)[-1].removesuffix(".o")
    return name[:40]
