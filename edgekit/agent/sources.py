"""Power sources behind one interface, chosen in order of preference: jtop → hwmon → tegrastats.

A source's ``read`` returns (monotonic time, mW per rail) or None when it has stopped. ``paced``
sources (hwmon) are polled by the sampler on its own clock; the others deliver at their own rate
and ``read`` blocks until the next value.

The total rail per board: VIN (Thor, INA238), VDD_IN (Orin NX / Nano), VIN_SYS_5V0 (AGX Orin),
POM_5V_IN (Nano, JetPack 4). When none is present the total is the sum of the rails, and the
sampler says so (``total_is_sum``).
"""

from __future__ import annotations

import time

from . import hwmon, jtopsrc, tegrastats

KINDS = ("auto", "jtop", "hwmon", "tegrastats", "none")
TOTAL_RAILS = ("VIN", "VDD_IN", "VIN_SYS_5V0", "POM_5V_IN")
MIN_HZ = 10.0  # what the benchmark promises; auto passes over a source that can't keep up


class Source:
    name = "none"
    paced = True

    def read(self) -> tuple[float, dict[str, float]] | None:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def describe(self) -> dict[str, object]:
        return {"source": self.name}


class HwmonSource(Source):
    name = "hwmon"
    paced = True

    def __init__(self, rails: list[hwmon.Rail]) -> None:
        self.rails = rails

    def read(self) -> tuple[float, dict[str, float]] | None:
        t = time.monotonic()
        return t, hwmon.read(self.rails)

    def describe(self) -> dict[str, object]:
        return {"source": self.name, "chips": sorted({r.chip for r in self.rails})}


class JtopSource(Source):
    name = "jtop"
    paced = False

    def __init__(self, stream: jtopsrc.JtopStream) -> None:
        self.stream = stream

    def read(self) -> tuple[float, dict[str, float]] | None:
        return self.stream.read()

    def close(self) -> None:
        self.stream.stop()

    def describe(self) -> dict[str, object]:
        return {"source": self.name, "jtop_interval_s": self.stream.server_interval}


class TegrastatsSource(Source):
    name = "tegrastats"
    paced = False

    def __init__(self, stream: tegrastats.TegrastatsStream, first: tuple[float, dict[str, int]] | None = None) -> None:
        self.stream = stream
        self.pending = first  # the line that proved tegrastats works: a sample like any other

    def read(self) -> tuple[float, dict[str, float]] | None:
        got, self.pending = self.pending, None
        if got is None:
            got = self.stream.read(timeout=max(5.0, self.stream.interval_ms / 250.0))
        if got is None:
            return None
        t, rails = got
        return t, {k: float(v) for k, v in rails.items()}

    def close(self) -> None:
        self.stream.stop()

    def describe(self) -> dict[str, object]:
        return {"source": self.name, "interval_ms": self.stream.interval_ms, "bursts": self.stream.bursts}


def _open_jtop(hz: float, strict: bool) -> tuple[Source | None, str]:
    ok, why = jtopsrc.availability()
    if not ok:
        return None, why
    stream = jtopsrc.JtopStream(1.0 / hz)
    try:
        stream.start()
    except Exception as exc:  # version mismatch, permissions, a dead service: all mean "not jtop"
        stream.stop()
        return None, f"jtop's client failed: {exc}".splitlines()[0]
    server = stream.server_interval or 0.0
    if not strict and server > 1.0 / MIN_HZ + 1e-9:
        # Another client started the service first and fixed its interval: too slow to integrate.
        stream.stop()
        return None, f"jtop's service runs every {server:g} s (another client set it), below {MIN_HZ:g} Hz"
    return JtopSource(stream), ""


def _open_hwmon() -> tuple[Source | None, str]:
    rails = hwmon.discover()
    if not rails:
        return None, "no INA3221/INA238 hwmon rails under /sys/bus/i2c/devices"
    if not hwmon.read(rails):
        return None, "INA hwmon rails found but none could be read"
    return HwmonSource(rails), ""


def _open_tegrastats(hz: float) -> tuple[Source | None, str]:
    exe = tegrastats.find_binary()
    if not exe:
        return None, "tegrastats not found"
    stream = tegrastats.TegrastatsStream(exe, round(1000.0 / hz))
    try:
        stream.start()
    except OSError as exc:
        return None, f"tegrastats did not start: {exc}"
    first = stream.read(timeout=max(3.0, 3 * stream.interval_ms / 1000.0))
    if first is None:
        stream.stop()
        return None, "tegrastats printed no power rails"
    return TegrastatsSource(stream, first), ""


def open_source(kind: str, hz: float) -> tuple[Source | None, dict[str, str]]:
    """The source to sample, and why each one tried before it was passed over."""
    if kind not in KINDS:
        raise ValueError(f"unknown power source {kind!r} (one of {', '.join(KINDS)})")
    order = ["jtop", "hwmon", "tegrastats"] if kind == "auto" else [] if kind == "none" else [kind]
    skipped: dict[str, str] = {}
    for name in order:
        if name == "jtop":
            src, why = _open_jtop(hz, strict=kind == "jtop")
        elif name == "hwmon":
            src, why = _open_hwmon()
        else:
            src, why = _open_tegrastats(hz)
        if src is not None:
            return src, skipped
        skipped[name] = why
    if kind == "none":
        skipped["none"] = "power sampling switched off (--source none)"
    return None, skipped


def choose_total(labels: list[str], override: str | None = None) -> tuple[str | None, bool]:
    """(total rail, total_is_sum). ``override``: a rail label, or "sum"."""
    if override == "sum":
        return None, True
    if override:
        return override, False  # trusted: the host knows the board's profile
    for name in TOTAL_RAILS:
        if name in labels:
            return name, False
    return None, True


def total_mw(rails: dict[str, float], total_rail: str | None) -> float | None:
    """The sample's total; None when the total rail wasn't read this time (never a silent sum)."""
    if total_rail is not None:
        return rails.get(total_rail)
    return round(sum(rails.values()), 3) if rails else None
