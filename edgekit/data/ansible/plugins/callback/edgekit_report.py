"""Callback `edgekit_report`: what happened on each host, as JSON for `edgekit fleet`.

Writes the file named by $EDGEKIT_FLEET_REPORT (nothing when unset) at the end of the playbook:

    {"hosts": {HOST: {"touched": bool, "changed": [task names], "failures": [{task, msg, rescued?}],
                      "unreachable": msg|null, "stats": {ok, changed, failures, ...}, "data": {set_stats},
                      "registered": {VAR: {stdout, rc, push counts} | {skipped}}}},  # by `register:`
     "stopped": bool,   # true when max_fail_percentage / any_errors_fatal ended a play early
     "tasks": [[task name, seconds], ...]}   # wall time of each task across its hosts, in order

Only data: the normal output still comes from the stdout callback.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from typing import Any

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
    name: edgekit_report
    type: aggregate
    short_description: per-host results as JSON for edgekit fleet
    description: Writes per-host changes, failures (with reasons) and set_stats data to $EDGEKIT_FLEET_REPORT.
    requirements:
      - enable in ansible.cfg (callbacks_enabled)
"""


def _payload(result: Any) -> dict[str, Any]:
    data = getattr(result, "result", None)  # 2.19's CallbackTaskResult; older: _result
    return dict(data if isinstance(data, dict) else getattr(result, "_result", {}) or {})


def _host_name(result: Any) -> str:
    return str((getattr(result, "host", None) or result._host).get_name())


def _task_name(result: Any) -> str:
    return str((getattr(result, "task", None) or result._task).get_name())


def _register(result: Any) -> str | None:
    return getattr(getattr(result, "task", None) or result._task, "register", None)


def _kept(res: dict[str, Any]) -> dict[str, Any]:
    """What edgekit reads of a registered result: stdout and rc (raw), the counts edgekit_blobs returns and its
    site pull's summary."""
    return {k: v for k, v in res.items()
            if k in ("stdout", "rc", "release_created", "site") or k.endswith(("_blobs", "_bytes"))}


def _reason(res: dict[str, Any]) -> str:
    msg = str(res.get("msg") or "").strip()
    tail = (str(res.get("stderr") or "").strip() or str(res.get("stdout") or "").strip()).splitlines()[-1:]
    if msg in ("", "non-zero return code") and tail:
        return f"{msg + ': ' if msg else ''}{tail[0][:300]}"
    return msg or "failed"


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "edgekit_report"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self.hosts: dict[str, dict[str, Any]] = {}
        self.stopped = False
        self._tasks: list[list[Any]] = []
        self._task_start: float | None = None

    def _close_task(self) -> None:
        if self._task_start is not None and self._tasks:
            self._tasks[-1][1] = round(time.monotonic() - self._task_start, 3)
        self._task_start = None

    def v2_playbook_on_task_start(self, task: Any, is_conditional: bool) -> None:
        self._close_task()
        self._tasks.append([task.get_name(), 0.0])
        self._task_start = time.monotonic()

    def v2_playbook_on_play_start(self, play: Any) -> None:
        self._close_task()

    def _host(self, name: str) -> dict[str, Any]:
        return self.hosts.setdefault(name, {"touched": False, "changed": [], "failures": [], "unreachable": None,
                                            "registered": {}})

    def _seen(self, result: Any) -> dict[str, Any]:
        entry = self._host(_host_name(result))
        entry["touched"] = True
        return entry

    def v2_runner_on_ok(self, result: Any) -> None:
        entry = self._seen(result)
        res = _payload(result)
        if res.get("changed"):
            entry["changed"].append(_task_name(result))
        name = _register(result)
        if name:
            entry["registered"][name] = _kept(res)

    def v2_runner_item_on_ok(self, result: Any) -> None:
        pass  # the task's own on_ok carries the loop's changed flag

    def v2_runner_on_failed(self, result: Any, ignore_errors: bool = False) -> None:
        entry = self._seen(result)
        if not ignore_errors:
            entry["failures"].append({"task": _task_name(result), "msg": _reason(_payload(result))})

    def v2_runner_on_skipped(self, result: Any) -> None:
        entry = self._seen(result)
        name = _register(result)
        if name:
            entry["registered"][name] = {"skipped": True}

    def v2_runner_on_unreachable(self, result: Any) -> None:
        entry = self._seen(result)
        entry["unreachable"] = _reason(_payload(result))

    def v2_playbook_on_no_hosts_remaining(self) -> None:
        self.stopped = True

    def v2_playbook_on_stats(self, stats: Any) -> None:
        self._close_task()
        path = os.environ.get("EDGEKIT_FLEET_REPORT")
        for name in stats.processed:
            entry = self._host(name)
            entry["stats"] = stats.summarize(name)
        for name, data in (stats.custom or {}).items():
            if name != "_run":
                self._host(name)["data"] = data
        if not path:
            return
        fd, tmp = tempfile.mkstemp(prefix=".edgekit-report-", dir=os.path.dirname(path) or ".")
        with os.fdopen(fd, "w") as fh:
            json.dump({"hosts": self.hosts, "stopped": self.stopped, "tasks": self._tasks}, fh, indent=1, default=str)
        os.replace(tmp, path)
