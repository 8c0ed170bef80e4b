"""The benchmark history: one SQLite file (stdlib sqlite3), safe for concurrent writers.

    runs       one row per results document ("a night"): board, recipe, release, llama.cpp ref,
               time; unique by the document's sha256, so adding the same file twice is a no-op
    samples    its per-repetition values, one row per (run, series, repetition)
    baselines  per board and recipe, the run the gate's baseline window starts at
               (`edgekit gate --update-baseline`)

Concurrency: WAL journal (readers never block the writer), a busy timeout (a second writer
waits instead of failing), and every write in one BEGIN IMMEDIATE transaction (it takes the
write lock up front, so two writers can't deadlock upgrading read locks). WAL needs a local
filesystem: keep the file off NFS/SMB.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from edgekit.errors import EdgekitError
from edgekit.history.metrics import metrics_from_results, run_labels

SCHEMA_VERSION = 1
BUSY_TIMEOUT_S = 60.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    digest TEXT NOT NULL UNIQUE,
    board TEXT NOT NULL,
    recipe TEXT NOT NULL,
    created TEXT,
    created_ts REAL NOT NULL,
    release TEXT,
    llama_ref TEXT,
    edgekit_version TEXT,
    sim INTEGER NOT NULL DEFAULT 0,
    source TEXT,
    added_ts REAL NOT NULL,
    info TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS runs_by_board ON runs (board, recipe, created_ts);
CREATE TABLE IF NOT EXISTS samples (
    run_id INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    series TEXT NOT NULL,
    metric TEXT NOT NULL,
    config TEXT NOT NULL,
    concurrency INTEGER NOT NULL,
    context_length INTEGER,
    unit TEXT NOT NULL,
    direction TEXT NOT NULL,
    rep INTEGER NOT NULL,
    value REAL NOT NULL,
    PRIMARY KEY (run_id, series, rep)
);
CREATE INDEX IF NOT EXISTS samples_by_metric ON samples (metric, series);
CREATE TABLE IF NOT EXISTS baselines (
    board TEXT NOT NULL,
    recipe TEXT NOT NULL,
    run_id INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    set_ts REAL NOT NULL,
    PRIMARY KEY (board, recipe)
);
"""


def default_db_path() -> Path:
    """$EDGEKIT_HISTORY, else $XDG_DATA_HOME/edgekit/history.sqlite (~/.local/share/…)."""
    if os.environ.get("EDGEKIT_HISTORY"):
        return Path(os.environ["EDGEKIT_HISTORY"]).expanduser()
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "edgekit" / "history.sqlite"


def digest_of(doc: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def timestamp(created: Any) -> float | None:
    if not isinstance(created, str) or not created:
        return None
    for parse in (lambda s: datetime.strptime(s, "%Y-%m-%dT%H:%M:%S%z"), datetime.fromisoformat):
        try:
            dt = parse(created)
        except ValueError:
            continue
        return (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).timestamp()
    return None


@dataclass(frozen=True)
class Run:
    id: int
    digest: str
    board: str
    recipe: str
    created: str | None
    created_ts: float
    release: str | None
    llama_ref: str | None
    sim: bool
    source: str | None

    @property
    def when(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M", time.gmtime(self.created_ts))


@dataclass(frozen=True)
class Added:
    run: Run
    new: bool  # False: this document was already in the history
    series: int


_RUN_COLS = "id, digest, board, recipe, created, created_ts, release, llama_ref, sim, source"


def _run(row: Sequence[Any]) -> Run:
    return Run(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], bool(row[8]), row[9])


class History:
    """The history file. Use as a context manager; every method is one short transaction."""

    def __init__(self, path: Path | str | None = None, *, timeout: float = BUSY_TIMEOUT_S) -> None:
        self.path = Path(path).expanduser() if path else default_db_path()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # isolation_level=None: we issue BEGIN IMMEDIATE / COMMIT ourselves.
            self.db = sqlite3.connect(self.path, timeout=timeout, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            raise EdgekitError(f"Cannot open the history {self.path}: {exc}.") from None
        try:
            self.db.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
            self.db.execute("PRAGMA foreign_keys = ON")
            self._wal()
            version = self.db.execute("PRAGMA user_version").fetchone()[0]
            if version == 0:  # a new file: create the tables (a reader of an existing one takes no write lock)
                with self._write():
                    for stmt in filter(str.strip, _SCHEMA.split(";")):
                        self.db.execute(stmt)
                    self.db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                version = SCHEMA_VERSION
        except sqlite3.DatabaseError as exc:
            self.db.close()
            raise EdgekitError(f"{self.path} is not an edgekit history (SQLite said: {exc}).") from None
        if version > SCHEMA_VERSION:
            self.db.close()
            raise EdgekitError(f"{self.path} was written by a newer edgekit (history schema {version}).")

    def _wal(self) -> None:
        # Switching to WAL wants a moment alone with the file; another process may be doing the same.
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        while True:
            try:
                self.db.execute("PRAGMA journal_mode = WAL")
                self.db.execute("PRAGMA synchronous = NORMAL")  # durable at checkpoints; safe in WAL
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------ writing

    def add(self, doc: dict[str, Any], source: str | None = None) -> Added:
        """Record a results document; the same document twice is recorded once."""
        labels = run_labels(doc)
        samples = metrics_from_results(doc)
        digest = digest_of(doc)
        created_ts = timestamp(labels["created"]) or time.time()
        settings = doc.get("settings") or {}
        board = doc.get("board") if isinstance(doc.get("board"), dict) else {}
        info = {"profile": labels["profile"], "repetitions": settings.get("repetitions"),
                "quick": settings.get("quick"), "nvpmodel": (board.get("nvpmodel") or {}).get("name"),
                "clocks_locked": board.get("clocks_locked")}
        with self._write() as db:
            row = db.execute(f"SELECT {_RUN_COLS} FROM runs WHERE digest = ?", (digest,)).fetchone()
            if row:
                return Added(_run(row), new=False, series=len(samples))
            cur = db.execute(
                "INSERT INTO runs (digest, board, recipe, created, created_ts, release, llama_ref, edgekit_version,"
                " sim, source, added_ts, info) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (digest, labels["board"], labels["recipe"], labels["created"], created_ts, labels["release"],
                 labels["llama_ref"], labels["edgekit_version"], int(labels["sim"]), source, time.time(),
                 json.dumps(info)))
            run_id = int(cur.lastrowid or 0)
            db.executemany(
                "INSERT INTO samples (run_id, series, metric, config, concurrency, context_length, unit, direction,"
                " rep, value) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(run_id, m.series, m.metric, m.config, m.concurrency, m.context_length, m.unit, m.direction, i, v)
                 for m in samples for i, v in enumerate(m.values)])
            row = db.execute(f"SELECT {_RUN_COLS} FROM runs WHERE id = ?", (run_id,)).fetchone()
        return Added(_run(row), new=True, series=len(samples))

    def set_baseline(self, run: Run) -> None:
        """The gate's window for this board and recipe starts at ``run`` (earlier nights drop out)."""
        with self._write() as db:
            db.execute("INSERT OR REPLACE INTO baselines (board, recipe, run_id, set_ts) VALUES (?, ?, ?, ?)",
                       (run.board, run.recipe, run.id, time.time()))

    # ------------------------------------------------------------------------------ reading

    def find(self, digest: str) -> Run | None:
        row = self.db.execute(f"SELECT {_RUN_COLS} FROM runs WHERE digest = ?", (digest,)).fetchone()
        return _run(row) if row else None

    def runs(self, board: str | None = None, recipe: str | None = None) -> list[Run]:
        """Runs oldest first, optionally of one board and/or recipe."""
        sql, args = f"SELECT {_RUN_COLS} FROM runs WHERE 1", []
        if board:
            sql, args = sql + " AND board = ?", [*args, board]
        if recipe:
            sql, args = sql + " AND recipe = ?", [*args, recipe]
        return [_run(r) for r in self.db.execute(sql + " ORDER BY created_ts, id", args)]

    def baseline_start(self, board: str, recipe: str) -> Run | None:
        row = self.db.execute(
            f"SELECT {', '.join('r.' + c.strip() for c in _RUN_COLS.split(','))} FROM baselines b "
            "JOIN runs r ON r.id = b.run_id WHERE b.board = ? AND b.recipe = ?", (board, recipe)).fetchone()
        return _run(row) if row else None

    def window(self, board: str, recipe: str, k: int, *, until_ts: float | None = None,
               exclude_digest: str | None = None, power_mode: str | bool | None = False) -> list[Run]:
        """The gate's baseline: the k most recent nights up to ``until_ts``, from the baseline start on; with
        ``power_mode`` (a name, or None for boards without one) only nights at that nvpmodel mode."""
        start = self.baseline_start(board, recipe)
        sql = f"SELECT {_RUN_COLS} FROM runs WHERE board = ? AND recipe = ?"
        args: list[Any] = [board, recipe]
        if power_mode is not False:
            sql, args = sql + " AND json_extract(info, '$.nvpmodel') IS ?", [*args, power_mode]
        if start is not None:
            sql, args = sql + " AND (created_ts > ? OR (created_ts = ? AND id >= ?))", \
                [*args, start.created_ts, start.created_ts, start.id]
        if until_ts is not None:
            sql, args = sql + " AND created_ts <= ?", [*args, until_ts]
        if exclude_digest:
            sql, args = sql + " AND digest != ?", [*args, exclude_digest]
        rows = self.db.execute(sql + " ORDER BY created_ts DESC, id DESC LIMIT ?", [*args, k]).fetchall()
        return [_run(r) for r in reversed(rows)]

    def values(self, run_ids: Sequence[int]) -> dict[str, dict[int, list[float]]]:
        """series → run id → its repetitions, for the given runs."""
        out: dict[str, dict[int, list[float]]] = {}
        if not run_ids:
            return out
        marks = ",".join("?" * len(run_ids))
        for series, run_id, value in self.db.execute(
                f"SELECT series, run_id, value FROM samples WHERE run_id IN ({marks}) ORDER BY run_id, series, rep",
                list(run_ids)):
            out.setdefault(series, {}).setdefault(run_id, []).append(value)
        return out

    def series_rows(self, board: str | None = None, metric: str | None = None,
                    recipe: str | None = None) -> list[dict[str, Any]]:
        """One row per (run, series): labels, mean, n and the repetitions; oldest first."""
        sql = ("SELECT r.id, r.board, r.recipe, r.created, r.created_ts, r.release, r.llama_ref, s.series, s.metric,"
               " s.config, s.concurrency, s.context_length, s.unit, s.direction, s.value"
               " FROM samples s JOIN runs r ON r.id = s.run_id WHERE 1")
        args: list[Any] = []
        for col, val in (("r.board", board), ("s.metric", metric), ("r.recipe", recipe)):
            if val:
                sql, args = sql + f" AND {col} = ?", [*args, val]
        rows: dict[tuple[int, str], dict[str, Any]] = {}
        for row in self.db.execute(sql + " ORDER BY r.created_ts, r.id, s.series, s.rep", args):
            entry = rows.get((row[0], row[7]))
            if entry is None:
                entry = rows[(row[0], row[7])] = {
                    "run_id": row[0], "board": row[1], "recipe": row[2], "created": row[3], "created_ts": row[4],
                    "release": row[5], "llama_ref": row[6], "series": row[7], "metric": row[8], "config": row[9],
                    "concurrency": row[10], "context_length": row[11], "unit": row[12], "direction": row[13],
                    "values": []}
            entry["values"].append(float(row[14]))
        for entry in rows.values():
            entry["n"] = len(entry["values"])
            entry["mean"] = sum(entry["values"]) / entry["n"]
        return list(rows.values())
