"""The INA3221 / INA238 power monitors, read straight from their hwmon files (what jtop reads).

Found the way jetson-stats 7.2 finds them: ``/sys/bus/i2c/devices/*/name`` says ina3221 or ina238,
then ``hwmon/hwmon*/in{k}_label`` names each channel. INA3221: ``in{k}_input`` (mV) ×
``curr{k}_input`` (mA); INA238 (Thor's VIN): ``power1_input`` (µW). INA3221 channel 7 ("sum of shunt
voltages") and channels labelled NC are skipped, as jtop does.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from .fs import board_glob, glob_sorted, read_int, read_text

CHIPS = ("ina3221", "ina238")
_LABEL_RE = re.compile(r"in(\d+)_label$")


@dataclass(frozen=True)
class Rail:
    label: str
    chip: str  # "ina3221" | "ina238"
    volt: str | None  # in{k}_input, mV
    curr: str | None  # curr{k}_input, mA
    power: str | None = None  # power1_input, µW (INA238 only)

    def read_mw(self) -> float | None:
        if self.power is not None:
            uw = read_int(self.power)
            if uw is not None:
                return uw / 1000.0
        if self.volt is None or self.curr is None:
            return None
        mv, ma = read_int(self.volt), read_int(self.curr)
        if mv is None or ma is None:
            return None
        return mv * ma / 1000.0


def _chip_of(name: str | None) -> str | None:
    low = (name or "").lower()
    return next((c for c in CHIPS if c in low), None)


def _hwmon_dirs() -> list[tuple[str, str]]:
    """(chip, hwmonN dir) for every INA chip; via i2c devices, else /sys/class/hwmon."""
    found: list[tuple[str, str]] = []
    seen: set[str] = set()
    for dev in board_glob("/sys/bus/i2c/devices/*"):
        chip = _chip_of(read_text(os.path.join(dev, "name")))
        if chip is None:
            continue
        for hw in glob_sorted(os.path.join(dev, "hwmon", "hwmon*")):
            real = os.path.realpath(hw)
            if real not in seen:
                seen.add(real)
                found.append((chip, hw))
    if not found:  # some kernels only show them under the class directory
        for hw in board_glob("/sys/class/hwmon/hwmon*"):
            chip = _chip_of(read_text(os.path.join(hw, "name")))
            real = os.path.realpath(hw)
            if chip is not None and real not in seen:
                seen.add(real)
                found.append((chip, hw))
    return found


def _rails_of(chip: str, hw: str) -> list[Rail]:
    if chip == "ina238":
        label = read_text(os.path.join(hw, "in1_label")) or "VIN"  # jtop names it VIN
        power = os.path.join(hw, "power1_input")
        volt, curr = os.path.join(hw, "in1_input"), os.path.join(hw, "curr1_input")
        return [Rail(label, chip, volt if os.path.exists(volt) else None, curr if os.path.exists(curr) else None,
                     power if os.path.exists(power) else None)]
    rails = []
    for name in sorted(os.listdir(hw)):
        m = _LABEL_RE.match(name)
        if not m or m.group(1) == "7":
            continue
        label = read_text(os.path.join(hw, name))
        if not label or label.upper() == "NC":
            continue
        k = m.group(1)
        volt, curr = os.path.join(hw, f"in{k}_input"), os.path.join(hw, f"curr{k}_input")
        if os.path.exists(volt) and os.path.exists(curr):
            rails.append(Rail(label, chip, volt, curr))
    return rails


def discover() -> list[Rail]:
    """Every readable rail, each label once (the first chip that has it wins)."""
    rails: list[Rail] = []
    labels: set[str] = set()
    for chip, hw in _hwmon_dirs():
        try:
            found = _rails_of(chip, hw)
        except OSError:
            continue
        for rail in found:
            if rail.label not in labels:
                labels.add(rail.label)
                rails.append(rail)
    return rails


def read(rails: list[Rail]) -> dict[str, float]:
    """mW per rail label; a rail that can't be read this time is left out."""
    out: dict[str, float] = {}
    for rail in rails:
        mw = rail.read_mw()
        if mw is not None:
            out[rail.label] = round(mw, 3)
    return out
