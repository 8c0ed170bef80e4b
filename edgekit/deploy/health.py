"""Is a release's server healthy? /health answers, then one real completion through its engine shows tokens
(and drafts), and a CUDA build's log shows the GPU in use."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from edgekit.release.health import HEALTH_PROMPT, Health, apply_gpu_policy
from edgekit.release.manifest import ReleaseManifest, ServeSpec
from edgekit.release.probes import chat_payload, media_outcome
from edgekit.remote.http import request
from edgekit.remote.runner import LocalRunner, SshRunner


def wait_ready(
    runner: SshRunner | LocalRunner, port: int, timeout: float, alive: Callable[[], bool] | None = None
) -> float:
    """Seconds until GET /health answers 200; raises TimeoutError.

    ``alive`` (optional) is asked between polls so a server that already died fails fast.
    """
    start = time.monotonic()
    last = "no answer"
    while time.monotonic() - start < timeout:
        try:
            resp = request(runner, port, "GET", "/health", timeout=5)
            if resp.status == 200:
                return time.monotonic() - start
            last = f"/health answered {resp.status}"  # 503 while the model loads
        except ConnectionError as exc:
            last = str(exc)
        if alive is not None and not alive():
            raise TimeoutError(f"the server exited before it was ready ({last})")
        time.sleep(0.25)
    raise TimeoutError(f"not ready after {timeout:.0f} s ({last})")


def check(runner: SshRunner | LocalRunner, spec: ServeSpec, timeout: float = 120.0,
          alive: Callable[[], bool] | None = None, n_predict: int = 24, log_file: str = "") -> Health:
    """/health answers, then one greedy completion through ``spec.engine``'s API shows tokens (and drafts, when
    ``spec.drafter``), and a CUDA build's server log (``log_file``) shows whether it used the GPU, as
    ``spec.gpu`` demands; a release with an mmproj answers each of ``spec.media`` too."""
    from edgekit.deploy.service import log_tail
    from edgekit.engines import get_engine

    try:
        ready = wait_ready(runner, spec.port, timeout, alive)
    except TimeoutError as exc:
        return Health(False, str(exc))
    health = get_engine(spec.engine).completion(runner, spec.port, spec.model, HEALTH_PROMPT, n_predict, timeout,
                                                spec.chat)
    health.seconds_to_ready = round(ready, 2)
    if not health.ok:
        return health
    if health.tokens <= 0:
        health.ok, health.reason = False, "the completion generated no tokens"
    elif spec.drafter and not health.draft_n:
        health.ok, health.reason = False, "a drafter is configured but the server drafted no tokens (draft_n = 0)"
    elif spec.gpu != "none":
        health = apply_gpu_policy(health, spec.gpu, log_tail(runner, log_file, 400))
    if health.ok and spec.media:
        health = media_checks(runner, spec.port, health, spec.media, timeout)
    return health


def check_release(runner: SshRunner | LocalRunner, manifest: ReleaseManifest, log_file: str, timeout: float = 120.0,
                  alive: Callable[[], bool] | None = None) -> Health:
    """:func:`check` with what a release's ``release.json`` says about how to check it."""
    return check(runner, manifest.serve, timeout=timeout, alive=alive, log_file=log_file)


def media_completion(runner: SshRunner | LocalRunner, port: int, kind: str, n_predict: int,
                     timeout: float) -> dict:
    """One greedy ``/v1/chat/completions`` with an image or a second of audio: llama-server's timings give the
    time to the first token (the media encoded and the prompt read) and the decode rate after it."""
    try:
        resp = request(runner, port, "POST", "/v1/chat/completions", chat_payload(kind, n_predict), timeout=timeout)
    except ConnectionError as exc:
        return {"ok": False, "reason": f"the {kind} request failed: {exc}"}
    if resp.status != 200:
        return {"ok": False, "reason": f"the {kind} request answered {resp.status}: {resp.body[:200]!r}"}
    data = resp.json()
    out = media_outcome(kind, data)
    message = ((data.get("choices") or [{}])[0].get("message") or {})
    out["text"] = str(message.get("content") or "")[:80]
    return out


def media_checks(runner: SshRunner | LocalRunner, port: int, health: Health, kinds: Sequence[str],
                 timeout: float, n_predict: int = 16) -> Health:
    """The release serves an mmproj: each of its kinds must be answered too."""
    health.media = {kind: media_completion(runner, port, kind, n_predict, timeout) for kind in kinds}
    failed = [m["reason"] for m in health.media.values() if not m["ok"]]
    if failed:
        health.ok, health.reason = False, failed[0]
    return health


def quick(runner: SshRunner | LocalRunner, port: int, recorded: dict, expect_drafts: bool) -> Health | None:
    """/health answers now and the release's recorded full check was good: that Health, else None."""
    fields = {k: recorded.get(k) for k in Health.__dataclass_fields__ if k in recorded}
    if not recorded.get("ok") or (expect_drafts and not recorded.get("draft_n")):
        return None
    try:
        if request(runner, port, "GET", "/health", timeout=5).status != 200:
            return None
    except ConnectionError:
        return None
    fields.update(ok=True, reason="healthy (/health answered; tokens and drafts as recorded at activation)",
                  method="recorded")
    return Health(**fields)
