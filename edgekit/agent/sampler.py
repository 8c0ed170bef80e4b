"""The sampler: power samples at a fixed rate, streamed as JSON lines.

File format (one JSON object per line, written as it happens so a reader can follow it):

    {"meta": {"source": "hwmon", "hz": 20, "total_rail": "VDD_IN", "total_is_sum": false, ...}}
    {"t": 1234.567891, "rails": {"VDD_IN": 5012.0, ...}, "total_mw": 5012.0}      (t: monotonic s)
    ...
    {"end": {"samples": 200, "sampling_rate_hz": 19.98, "reason": "SIGTERM", ...}}

With no power source the file holds only ``{"meta": {"power": "unavailable", "reasons": {...}}}``
and the end line. A torn last line (the writer was killed) is skipped by energy.read_samples.
"""

from __future__ import annotations

import json
import os
import time
from typing import IO, Any, Callable

from . import AGENT_VERSION, extras, sources
from .energy import sampling_rate_hz
from .fs import board_root


def _dump(rec: dict[str, Any]) -> str:
    return json.dumps(rec, separators=(",", ":")) + "\n"


class Sampler:
    def __init__(self, source: sources.Source | None, hz: float, out: IO[str] | None = None,
                 total_rail: str | None = None, duration_s: float | None = None, keep: bool = False,
                 skipped: dict[str, str] | None = None) -> None:
        if hz <= 0:
            raise ValueError("--hz must be positive")
        self.source = source
        self.hz = float(hz)
        self.out = out
        self.total_override = total_rail
        self.duration_s = duration_s
        self.keep = keep
        self.skipped = skipped or {}
        self.samples: list[dict[str, Any]] = []
        self.times: list[float] = []
        self.max_gap = 0.0
        self.meta: dict[str, Any] = {}
        self.next_state = 0.0  # when the next temperatures-and-clocks line is due

    # Heat next to power: temperatures and clock caps twice a second, so a window in which the board throttled
    # (a zone past its passive trip point, a clock cap lowered) can be told apart (bench/heat.py).
    STATE_EVERY_S = 0.5

    def _state(self, now: float) -> None:
        if now >= self.next_state:
            self.next_state = now + self.STATE_EVERY_S
            self._write({"state": {"t": round(now, 6), "temps_c": extras.temperatures_c(),
                                   "caps_mhz": extras.clock_caps_mhz()}})

    def _write(self, rec: dict[str, Any]) -> None:
        if self.out is not None:
            self.out.write(_dump(rec))

    def _meta(self, first_rails: dict[str, float] | None) -> dict[str, Any]:
        meta: dict[str, Any] = {"agent_version": AGENT_VERSION, "clock": "monotonic", "hz": self.hz,
                                "start_t": round(time.monotonic(), 6), "start_wall": time.time(),
                                "board_root": board_root() or "/", "pid": os.getpid()}
        if self.source is None:
            meta.update(power="unavailable", reasons=self.skipped)
            return meta
        meta["skipped"] = self.skipped
        meta["throttle_points_c"] = extras.throttle_points_c()
        labels = sorted(first_rails or {})
        total, is_sum = sources.choose_total(labels, self.total_override)
        meta.update(self.source.describe())
        meta.update(power="available", rails=labels, total_rail=total, total_is_sum=is_sum)
        if is_sum:
            meta["total_note"] = ("no total rail (VIN, VDD_IN, VIN_SYS_5V0, POM_5V_IN) on this board: "
                                  "total_mw is the sum of the rails")
        return meta

    def _record(self, t: float, rails: dict[str, float]) -> None:
        rec = {"t": round(t, 6), "rails": rails, "total_mw": sources.total_mw(rails, self.meta.get("total_rail"))}
        if self.times:
            self.max_gap = max(self.max_gap, t - self.times[-1])
        self.times.append(t)
        if self.keep:
            self.samples.append(rec)
        self._write(rec)

    def run(self, should_stop: Callable[[], str | None]) -> dict[str, Any]:
        """Sample until ``should_stop()`` names a reason, the duration is over, or the source ends."""
        start = time.monotonic()
        first = self.source.read() if self.source is not None else None
        self.meta = self._meta(first[1] if first else None)
        self._write({"meta": self.meta})
        if self.source is None:
            return self._end("power unavailable", start)
        if first is None:
            return self._end("the power source gave no first sample", start)
        self._record(*first)
        period = 1.0 / self.hz
        next_t = first[0] + period
        reason = None
        while reason is None:
            reason = should_stop()
            if reason is not None:
                break
            now = time.monotonic()
            if self.duration_s is not None and now - start >= self.duration_s:
                reason = "duration"
                break
            if self.source.paced and now < next_t:
                time.sleep(next_t - now)
                continue
            got = self.source.read()
            if got is None:
                reason = f"the {self.source.name} source stopped delivering"
                break
            self._record(*got)
            self._state(got[0])
            next_t += period
            if time.monotonic() - next_t > period:
                next_t = time.monotonic()  # fell behind (board busy): resume the rate, no catch-up burst
        return self._end(reason, start)

    def _end(self, reason: str, start: float) -> dict[str, Any]:
        end = {"reason": reason, "samples": len(self.times), "duration_s": round(time.monotonic() - start, 6),
               "t_first": self.times[0] if self.times else None, "t_last": self.times[-1] if self.times else None,
               "sampling_rate_hz": sampling_rate_hz(self.times), "max_gap_s": round(self.max_gap, 6) or None}
        if self.source is not None:
            end.update({k: v for k, v in self.source.describe().items() if k == "bursts"})
        self._write({"end": end})
        return end
