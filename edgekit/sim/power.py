"""The power updater: one detached process per sim dir that keeps every board's sensors moving.

Twenty times a second it computes each board's rails: watts = idle + per-core share × busy cores,
where a board's busy cores are the CPU time used by the processes started under that board's
sshd (sessions, what they start, services of its `systemctl` stand-in), averaged over 0.3 s.
So a board's sensors follow that board's real load, and boards don't see each other's load.
A reading that did not change since the last tick is not rewritten (an idle board costs little);
sensor noise and bus voltage wobble at 2 Hz.

A board with ``power_trace.json`` ({"start": epoch_s, "points": [[t_s, watts_total], …]}, or just
the list with the file's mtime as start) has its total rail driven by the trace instead (linear
interpolation, first/last value outside it); its other rails still follow the load.

Cheap by design: every 0.25 s /proc is listed and only new pids are read (see ProcTable); each
tick reads the stat files of the boards' own processes. Run: ``python -m edgekit.sim.power SIM_DIR``.
"""

from __future__ import annotations

import bisect
import json
import os
import random
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from edgekit.config.profiles import get_profile
from edgekit.sim import procs as procs_mod
from edgekit.sim import state as state_mod
from edgekit.sim.rootfs import (
    CELSIUS_PER_BUSY_CORE,
    THROTTLE_C,
    THROTTLED_FRACTION,
    mode_cpu_fraction,
    nominal_mv,
    rail_files,
    set_cpu_caps,
    thermal_zones,
    write_atomic,
)
from edgekit.sim.state import BoardState

TICK_S = 0.05  # 20 Hz: comfortably above the ≥ 10 Hz readers are promised
SCAN_EVERY = 5  # ticks between /proc listings: new processes are seen within 0.25 s
WINDOW_S = 0.3  # CPU time is averaged over this long (jiffies are 10 ms: shorter is noisy)
THERMAL_EVERY = 10  # thermal zones update at 2 Hz, as on a real board
STATE_EVERY = 10  # look for added/removed boards twice a second
TEMP_TAU_S = 3.0  # thermal time constant of the simulated heat sink
CLK_TCK = os.sysconf("SC_CLK_TCK")

Stat = tuple[int, int, int]  # ppid, starttime, utime+stime (ticks)


def read_stat(pid: int) -> Stat | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    f = data[data.rindex(b")") + 2:].split()  # comm may hold spaces and parens
    return int(f[1]), int(f[19]), int(f[11]) + int(f[12])


def environ_board(pid: int, token: str) -> str | None:
    """The sim board a process was started on, from the variables its board session set."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            env = dict(kv.split(b"=", 1) for kv in fh.read().split(b"\0") if b"=" in kv)
    except OSError:
        return None
    if env.get(b"EDGEKIT_SIM_ID") != token.encode():
        return None
    board = env.get(b"EDGEKIT_SIM_BOARD")
    return board.decode() if board else None


class ProcTable:
    """Which board each process belongs to.

    A process belongs to the board of its parent, decided once, when it is first seen; so a
    daemon that detaches from its ssh session stays that board's load. A process whose parent
    is gone or is PID 1 is placed by the EDGEKIT_SIM_* variables the board's sshd set for it.
    Each scan reads the stat files of new pids only.
    """

    def __init__(self, token: str) -> None:
        self.token = token
        self.known: dict[int, tuple[int, int, str | None]] = {}  # pid → (starttime, ppid, board)

    def scan(self, roots: dict[int, str]) -> None:
        pids = {int(n) for n in os.listdir("/proc") if n.isdigit()}
        for gone in self.known.keys() - pids:
            del self.known[gone]
        fresh: dict[int, Stat] = {}
        for pid in pids - self.known.keys():
            st = read_stat(pid)
            if st is not None:
                fresh[pid] = st
        for pid in sorted(fresh):
            self._place(pid, fresh, roots, 0)

    def _place(self, pid: int, fresh: dict[int, Stat], roots: dict[int, str], depth: int) -> str | None:
        if pid in self.known:
            return self.known[pid][2]
        ppid, start, _ = fresh[pid]
        if pid in roots:
            board: str | None = roots[pid]
        elif ppid > 1 and (ppid in self.known or ppid in fresh) and depth < 64:
            board = self._place(ppid, fresh, roots, depth + 1)
        else:  # orphaned before we saw it (setsid + exit, systemctl's supervisor, …)
            board = environ_board(pid, self.token)
        self.known[pid] = (start, ppid, board)
        return board

    def assign(self, roots: dict[int, str]) -> None:
        """(Re)place known processes under ``roots`` (boards just added to the updater) and
        orphans that carry a board's variables (services running before this updater started)."""
        children: dict[int, list[int]] = {}
        orphans: dict[int, str] = {}
        for pid, (_, ppid, board) in self.known.items():
            children.setdefault(ppid, []).append(pid)
            if ppid <= 1 and board is None:
                found = environ_board(pid, self.token)
                if found is not None:
                    orphans[pid] = found
        for root, board in {**orphans, **roots}.items():
            todo = [root]
            while todo:
                pid = todo.pop()
                if pid in self.known:
                    start, ppid, _ = self.known[pid]
                    self.known[pid] = (start, ppid, board)
                    todo.extend(children.get(pid, ()))

    def members(self) -> dict[str, dict[int, int]]:
        """board → {pid: starttime}."""
        out: dict[str, dict[int, int]] = {}
        for pid, (start, _, board) in self.known.items():
            if board is not None:
                out.setdefault(board, {})[pid] = start
        return out


@dataclass
class Trace:
    start: float
    ts: list[float]
    ws: list[float]

    @classmethod
    def load(cls, path: Path) -> Trace:
        raw = json.loads(path.read_text())
        start = path.stat().st_mtime
        if isinstance(raw, dict):
            start, raw = float(raw["start"]), raw["points"]
        points = sorted((float(t), float(w)) for t, w in raw)
        if not points:
            raise ValueError("the trace has no points")
        return cls(start, [t for t, _ in points], [w for _, w in points])

    def at(self, now: float) -> float:
        t = now - self.start
        i = bisect.bisect_right(self.ts, t)
        if i == 0:
            return self.ws[0]
        if i == len(self.ts):
            return self.ws[-1]
        t0, t1, w0, w1 = self.ts[i - 1], self.ts[i], self.ws[i - 1], self.ws[i]
        return w0 + (w1 - w0) * (t - t0) / (t1 - t0)


class TraceFile:
    """A scripted trace the tests may drop beside a board (read again whenever the file changes)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.trace: Trace | None = None
        self.mtime: float | None = None

    def value(self, now: float) -> float | None:
        try:
            mtime = self.path.stat().st_mtime
        except OSError:
            self.trace = self.mtime = None
            return None
        if mtime != self.mtime:
            self.mtime = mtime
            try:
                self.trace = Trace.load(self.path)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                self.trace = None
                print(f"ignoring {self.path}: {exc}", file=sys.stderr, flush=True)
        return self.trace.at(now) if self.trace else None


class Meter:
    """One board: its process tree, its CPU-time history and its sensor files."""

    def __init__(self, board: BoardState) -> None:
        self.board = board
        self.profile = get_profile(board.profile)
        self.rails = [(f.rail, str(f.volt), str(f.curr), str(f.power) if f.power else None)
                      for f in rail_files(board.root, self.profile)]
        self.mv = [0] * len(self.rails)  # bus voltage written last, per rail
        self.noise = [1.0] * len(self.rails)
        self.last: list[tuple[int, int] | None] = [None] * len(self.rails)  # (mA, mV) written last
        self.zones = [(str(path), share, idle) for path, share, idle in thermal_zones(board.root, self.profile)]
        self.tracked: dict[int, tuple[int, int]] = {}  # pid → (starttime, ticks last seen)
        self.cum = 0  # ticks used by the board's processes since the updater found it
        self.hist: deque[tuple[float, int]] = deque()
        self.primed = False  # the first scan only learns what is there
        self.heat = 0.0  # busy cores, low-pass filtered for the thermal zones
        self.mode_scale = 1.0  # watts per busy core at the board's nvpmodel mode (bin/nvpmodel)
        self.trace = TraceFile(board.power_trace)
        self.heat_trace = TraceFile(board.thermal_trace)
        self.throttled = False

    def sample(self, now: float, pids: dict[int, int]) -> float:
        """Busy cores of this board now (0 … cpu_cores), from its processes' CPU time."""
        current: dict[int, tuple[int, int]] = {}
        for pid, start in pids.items():
            st = read_stat(pid)
            if st is not None and st[1] == start:
                current[pid] = (start, st[2])
        for pid, (start, ticks) in current.items():
            prev = self.tracked.get(pid)
            if prev is not None and prev[0] == start:
                self.cum += max(ticks - prev[1], 0)
            elif self.primed:
                self.cum += ticks  # new since the last look: all its time is this board's
        self.tracked = current
        self.primed = True  # what ran before the updater found the board is not counted
        self.hist.append((now, self.cum))
        while len(self.hist) > 2 and self.hist[1][0] <= now - WINDOW_S:
            self.hist.popleft()
        t0, c0 = self.hist[0]
        busy = (self.cum - c0) / CLK_TCK / (now - t0) if now > t0 else 0.0
        return min(max(busy, 0.0), float(self.profile.cpu_cores))

    def write(self, now: float, busy: float, thermal: bool) -> None:
        traced = self.trace.value(now)
        if thermal:  # the power mode: a busy core at a lower ceiling draws ~ f² (dynamic power ~ f·V², V ~ f)
            self.mode_scale = mode_cpu_fraction(self.board.root) ** 2
        for i, (rail, volt, curr, power) in enumerate(self.rails):
            if thermal or not self.mv[i]:
                # Bus voltage and sensor noise wobble slowly (2 Hz); the load term moves every tick.
                self.noise[i] = random.gauss(1.0, 0.004)
                mv = nominal_mv(rail) + random.randint(-3, 3)
                if mv != self.mv[i]:
                    self.mv[i] = mv
                    write_atomic(volt, f"{mv}\n")
            if traced is not None and rail.label == self.profile.total_power_rail:
                watts = traced
            else:
                watts = (rail.idle_watts + rail.watts_per_busy_core * busy * self.mode_scale) * self.noise[i]
            ma = round(max(watts, 0.0) * 1e6 / self.mv[i])
            if (ma, self.mv[i]) == self.last[i]:
                continue  # same reading: rewriting it would only cost CPU
            self.last[i] = (ma, self.mv[i])
            write_atomic(curr, f"{ma}\n")
            if power is not None:
                write_atomic(power, f"{self.mv[i] * ma}\n")  # mV × mA = µW
        if thermal:
            self.heat += (busy - self.heat) * min(1.0, TICK_S * THERMAL_EVERY / TEMP_TAU_S)
            scripted = self.heat_trace.value(now)
            hottest = 0.0
            for path, share, idle in self.zones:
                temp = (scripted if scripted is not None else idle + share * CELSIUS_PER_BUSY_CORE * self.heat) \
                    + random.uniform(-0.15, 0.15)
                hottest = max(hottest, temp)
                write_atomic(path, f"{round(temp * 1000)}\n")
            if (hottest >= THROTTLE_C) != self.throttled:  # past the trip point the kernel lowers the CPU caps
                self.throttled = not self.throttled
                ceiling = mode_cpu_fraction(self.board.root)
                set_cpu_caps(self.board.root, ceiling * (THROTTLED_FRACTION if self.throttled else 1.0))


class Updater:
    def __init__(self, sim_dir: Path) -> None:
        self.sim_dir = sim_dir
        self.meters: dict[str, Meter] = {}
        self.state_mtime: int | None = None
        self.table: ProcTable | None = None
        self.roots: dict[int, str] = {}  # sshd pid → board
        self.members: dict[str, dict[int, int]] = {}

    def reload(self) -> bool:
        """Pick up added/removed boards; False when this updater should end."""
        try:
            mtime = state_mod.state_path(self.sim_dir).stat().st_mtime_ns
        except OSError:
            return False  # `sim down` removed the state: nothing left to update
        if mtime == self.state_mtime:
            return True
        self.state_mtime = mtime
        st = state_mod.load(self.sim_dir)
        if st is None or not st.boards:
            return False
        if st.updater_pid not in (None, os.getpid()) and procs_mod.alive(st.updater_pid, st.updater_ctime):
            return False  # another updater owns this dir
        if self.table is None:
            self.table = ProcTable(st.token)
            self.table.scan({})
        meters: dict[str, Meter] = {}
        for name, board in st.boards.items():
            old = self.meters.get(name)
            meters[name] = old if old and old.board == board else Meter(board)
        self.meters = meters
        self.roots = {b.sshd_pid: name for name, b in st.boards.items() if b.sshd_pid}
        self.table.assign(self.roots)  # sessions opened before we heard of the board
        self.members = self.table.members()
        return True

    def run(self) -> None:
        print(f"power updater {os.getpid()} for {self.sim_dir}", file=sys.stderr, flush=True)
        tick, next_t = 0, time.monotonic()
        while True:
            if tick % STATE_EVERY == 0 and not self.reload():
                print("no boards left; exiting", file=sys.stderr, flush=True)
                return
            if tick % SCAN_EVERY == 0 and self.table is not None:
                self.table.scan(self.roots)
                self.members = self.table.members()
            now = time.time()
            for name, meter in self.meters.items():
                try:
                    busy = meter.sample(now, self.members.get(name, {}))
                    meter.write(now, busy, thermal=tick % THERMAL_EVERY == 0)
                except OSError as exc:  # a board dir being removed under us
                    print(f"{name}: {exc}", file=sys.stderr, flush=True)
            tick += 1
            next_t += TICK_S
            delay = next_t - time.monotonic()
            if delay < 0:  # fell behind (machine busy): don't try to catch up in a burst
                next_t, delay = time.monotonic(), 0.0
            time.sleep(delay)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.exit("usage: python -m edgekit.sim.power SIM_DIR")
    Updater(Path(args[0]).resolve()).run()


if __name__ == "__main__":
    main()
