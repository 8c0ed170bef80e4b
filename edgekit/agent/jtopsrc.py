"""jtop (jetson-stats) as a power source: its client, when it is importable and its service runs.

The client talks to the root service over a UNIX socket (``/run/jtop.sock``, under the board root
like every other path here). ``jetson.power`` is ``{'rail': {NAME: {volt, curr, power, avg, ...}},
'tot': {...}}`` in mW; jtop moves the total rail it knows (VIN, POM_5V_IN, VDD_IN) out of ``rail``
into ``tot`` (with ``name``), otherwise ``tot`` is its own sum. Only ``power`` is used: ``avg`` is a
running (new + old) / 2 and must never be integrated.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from typing import Any

from .fs import board_path

SOCKET = "/run/jtop.sock"


def socket_path() -> str:
    return board_path(SOCKET)


def availability() -> tuple[bool, str]:
    """(usable, why not): jtop importable and its service socket present."""
    try:
        import jtop  # noqa: F401  (only asking whether it is there)
    except Exception as exc:  # an old or broken jetson-stats raises more than ImportError
        return False, f"jtop is not importable ({type(exc).__name__})"
    path = socket_path()
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False, f"jtop's service is not running (no {path})"
    if not stat.S_ISSOCK(mode):
        return False, f"{path} is not a socket"
    return True, ""


def rails_from_power(power: dict[str, Any]) -> dict[str, float]:
    """mW per rail from ``jetson.power``, the total rail put back among the rails; ``avg`` ignored."""
    out: dict[str, float] = {}
    for name, values in (power.get("rail") or {}).items():
        if isinstance(values, dict) and values.get("power") is not None and values.get("online", True):
            out[str(name)] = float(values["power"])
    tot = power.get("tot") or {}
    if isinstance(tot, dict) and tot.get("name") and tot.get("power") is not None:
        out[str(tot["name"])] = float(tot["power"])  # a real rail jtop moved out; an unnamed tot is a sum
    return out


class JtopStream:
    """jtop's client at ``interval`` s; ``read`` blocks until the service's next update."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.client: Any = None
        self.server_interval: float | None = None

    def start(self) -> None:
        import jtop.service
        from jtop import jtop as client_cls

        # The client reads this module global when it connects: point it under the board root.
        jtop.service.JTOP_PIPE = socket_path()
        self.client = client_cls(interval=self.interval)
        self.client.start()
        self.server_interval = float(self.client.interval)

    def read(self) -> tuple[float, dict[str, float]] | None:
        """(receipt time, mW per rail), or None once the service stopped answering."""
        if not self.client.ok():
            return None
        t = time.monotonic()
        try:
            power = self.client.power or {}
        except Exception:  # a service without power data this tick: an empty sample, not a crash
            power = {}
        return t, rails_from_power(power)

    def stop(self) -> None:
        if self.client is not None:
            with contextlib.suppress(Exception):  # closing a broken connection must not mask why we stopped
                self.client.close()
            self.client = None
