"""Is a release's server healthy? The host's side of edgekit's one health check, which runs on the board
(edgekit/agent/health.py); and the waits and media requests the bench makes through the SSH connection."""

from __future__ import annotations

import time
from collections.abc import Callable

from edgekit.agent import health as board_health
from edgekit.agent.health import chat_payload, media_outcome
from edgekit.release.health import HEALTH_PROMPT, Health
from edgekit.release.manifest import ReleaseManifest, ServeSpec
from edgekit.remote import agent_call
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


def check_settings(spec: ServeSpec, timeout: float, n_predict: int = 24) -> dict[str, object]:
    """How the board's check asks ``spec``'s server (agent/health.py check_options' keywords), in its engine's
    dialect."""
    from edgekit.engines import get_engine

    return {"drafter": spec.drafter, "timeout": timeout, "n_predict": n_predict, "prompt": HEALTH_PROMPT,
            "api": get_engine(spec.engine).health_api, "model": spec.model, "gpu": spec.gpu, "chat": spec.chat,
            "media": list(spec.media), "key_file": spec.key_file}


def draft_counters(spec: ServeSpec) -> tuple[str, ...]:
    """The /metrics counters of the release's drafts: as it records them, else as its engine names them (a release
    made before engines named theirs)."""
    from edgekit.engines import get_engine

    return spec.draft_counters or tuple(get_engine(spec.engine).draft_counters or ())


def check(runner: SshRunner | LocalRunner, base: str, spec: ServeSpec, timeout: float = 120.0, unit: str = "",
          n_predict: int = 24, log_file: str = "") -> Health:
    """edgekit's health check, the agent's `health` verb on the board whose base is ``base`` (absolute;
    edgekit/agent/health.py): /health answers, then one greedy
    completion through ``spec.engine``'s API shows tokens (and drafts, when ``spec.drafter``), a CUDA build's
    server log (``log_file``) shows whether it used the GPU, as ``spec.gpu`` demands, and a release with an
    mmproj answers each of ``spec.media`` too. ``unit``: the unit serving it, so a server that died fails fast."""
    args = board_health.command_args(spec.port, unit=unit, log=log_file, draft_counters=draft_counters(spec),
                                     **check_settings(spec, timeout, n_predict))
    # Its own timeouts end it; this one only guards against a board that stops answering altogether.
    res = agent_call.run(runner, base, "health", *args, timeout=timeout * (2 + len(spec.media)) + 60)
    got = agent_call.answer(res)
    if not res.ok or got is None:
        return Health(False, f"the board's health check did not run: {agent_call.why(res)}")
    try:
        return Health.of_dict(got)
    except TypeError:  # a field it must have is missing
        return Health(False, f"the board's health check answered what edgekit cannot read: {res.stdout[-200:]!r}")


def check_release(runner: SshRunner | LocalRunner, base: str, manifest: ReleaseManifest, log_file: str,
                  timeout: float = 120.0, unit: str = "") -> Health:
    """:func:`check` with what a release's ``release.json`` says about how to check it."""
    return check(runner, base, manifest.serve, timeout=timeout, unit=unit, log_file=log_file)


def media_completion(runner: SshRunner | LocalRunner, port: int, kind: str, n_predict: int,
                     timeout: float, api_key: str | None = None) -> dict:
    """One greedy ``/v1/chat/completions`` with an image or a second of audio (the bench's; the health check
    sends the same): llama-server's timings give the time to the first token (the media encoded and the prompt
    read) and the decode rate after it."""
    try:
        resp = request(runner, port, "POST", "/v1/chat/completions", chat_payload(kind, n_predict), timeout=timeout,
                       api_key=api_key)
    except ConnectionError as exc:
        return {"ok": False, "reason": f"the {kind} request failed: {exc}"}
    if resp.status != 200:
        return {"ok": False, "reason": f"the {kind} request answered {resp.status}: {resp.body[:200]!r}"}
    return media_outcome(kind, resp.json())


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
