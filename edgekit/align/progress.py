"""A progress bar for alignment: steps, loss, and the held-out acceptance at the last evaluation."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from edgekit.align.train import StepReport


class AlignProgress:
    def __init__(self, console: Console) -> None:
        self._progress = Progress(
            TextColumn("[bold]aligning[/bold]"), BarColumn(bar_width=20), MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"), TextColumn("held-out {task.fields[acc]}"),
            TimeElapsedColumn(), TimeRemainingColumn(), console=console)
        self._task: TaskID | None = None

    def __enter__(self) -> AlignProgress:
        self._progress.__enter__()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._progress.__exit__(exc_type, exc, tb)

    def on_step(self, report: StepReport) -> None:
        if self._task is None:
            self._task = self._progress.add_task("align", total=report.total, completed=report.resumed_from,
                                                 loss="…", acc="…")
        fields: dict[str, str] = {"loss": f"{report.loss:.4f}"}
        if report.heldout is not None:
            h = report.heldout
            fields["acc"] = f"{h['acceptance_rate']:.0%} acc, {h['tokens_per_verify']:.2f} tok/pass"
        self._progress.update(self._task, completed=report.step, **fields)


__all__ = ["AlignProgress"]
