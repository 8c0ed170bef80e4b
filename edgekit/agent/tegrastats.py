"""tegrastats: parse its power rails, and run it as a stream of timestamped samples.

Rail tokens across releases (first number = the instantaneous reading; the rest are tegrastats' own
running average and, from JetPack 7.2 on, the maximum, which we never use):

    JetPack 4:        VDD_IN 3902/3611                                  (mW, no unit)
    JetPack 5/6/7.0:  VDD_GPU_SOC 2390mW/2390mW   VDD_IN 17946mW/15710mW   VDD_GPU -392mW/-392mW
    JetPack 7.2:      VDD_GPU 37528mW/37528mW/37528mW  VIN 87426mW/43713mW/87426mW

Rails labelled NC (not connected, AGX Orin's second INA3221) are skipped. Real lines from Orin AGX,
Orin NX/Nano and Thor are in tests/data/tegrastats/, with where each came from.
"""

from __future__ import annotations

import queue
import re
import shutil
import subprocess
import threading
import time

# A name, then 2 or 3 slash-separated integers, each optionally "mW". The look-behind/-ahead keep
# "RAM 2257/30536MB" and "SWAP 0/15268MB (cached 0MB)" out (a unit other than mW follows).
_RAIL_RE = re.compile(
    r"(?:^|(?<=\s))([A-Za-z][A-Za-z0-9_]*) (-?\d+)(?:mW)?/(-?\d+)(?:mW)?(?:/(-?\d+)(?:mW)?)?(?![\w.%])")


def parse_power(line: str) -> dict[str, int]:
    """Instantaneous mW per rail in one tegrastats line (empty when it has no rails)."""
    out: dict[str, int] = {}
    for m in _RAIL_RE.finditer(line):
        name = m.group(1)
        if name.upper() == "NC" or name in out:
            continue
        out[name] = int(m.group(2))
    return out


def find_binary() -> str | None:
    return shutil.which("tegrastats") or next(
        (p for p in ("/usr/bin/tegrastats", "/usr/sbin/tegrastats") if shutil.which(p)), None)


class TegrastatsStream:
    """``tegrastats --interval MS`` in a child process; each line becomes (receipt time, rails).

    Lines are timestamped when they arrive, so stdout must not be block-buffered: it runs under
    ``stdbuf -oL`` when stdbuf exists. ``bursts`` counts lines that arrived much closer together than
    the interval (a sign of buffering, which would make the timestamps unreliable).
    """

    def __init__(self, exe: str, interval_ms: int) -> None:
        self.exe = exe
        self.interval_ms = max(int(interval_ms), 1)
        self.proc: subprocess.Popen[str] | None = None
        self.lines: queue.Queue[tuple[float, dict[str, int]] | None] = queue.Queue()
        self.bursts = 0
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        argv = [self.exe, "--interval", str(self.interval_ms)]
        stdbuf = shutil.which("stdbuf")
        if stdbuf:
            argv = [stdbuf, "-oL", *argv]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                                     text=True, bufsize=1)
        self.thread = threading.Thread(target=self._pump, name="tegrastats", daemon=True)
        self.thread.start()

    def _pump(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        last = None
        for line in self.proc.stdout:
            now = time.monotonic()
            rails = parse_power(line)
            if not rails:
                continue
            if last is not None and now - last < self.interval_ms / 4000.0:
                self.bursts += 1
            last = now
            self.lines.put((now, rails))
        self.lines.put(None)  # tegrastats ended

    def read(self, timeout: float) -> tuple[float, dict[str, int]] | None:
        """The next sample; None when tegrastats ended or nothing came within ``timeout``."""
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            return None

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.thread is not None:
            self.thread.join(timeout=2)  # it sees EOF once tegrastats is gone; then the pipe can close
        if self.proc.stdout is not None and (self.thread is None or not self.thread.is_alive()):
            self.proc.stdout.close()
        self.proc = None
