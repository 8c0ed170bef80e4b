"""Is a llama-server healthy? /health answers, then one real completion shows tokens (and drafts)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Literal

from edgekit.deploy.probes import answer_text, chat_payload, completion_request, media_outcome
from edgekit.remote.http import request
from edgekit.remote.runner import LocalRunner, SshRunner

HEALTH_PROMPT = "The three primary colours are"
# What the server must do with the GPU: "none" (a CPU build), "required" (a CUDA build on a board with
# a GPU driver: a CPU fallback is a failed deploy), "optional" (a CUDA build on a board without one, an
# emulated board: the fallback is reported, plainly).
GpuPolicy = Literal["none", "required", "optional"]
# ggml-cuda's first words at start-up (the last start's line wins; the log is appended to).
_CUDA_INIT = re.compile(r"ggml_cuda_init: (found (\d+) CUDA devices?|failed to initialize CUDA: [^\n]*)")


@dataclass
class Health:
    ok: bool
    reason: str
    seconds_to_ready: float | None = None
    tokens: int = 0
    tokens_per_second: float | None = None
    draft_n: int | None = None
    draft_n_accepted: int | None = None
    text: str = ""
    # "completion" / "chat completion" (through the model's chat template): measured now; "recorded": /health
    # now, figures from activation
    method: str = "completion"
    gpu: str | None = None  # CUDA builds: "used (N CUDA devices)" or "not used: <why>"; CPU builds: None
    media: dict[str, dict] | None = None  # per kind ("image", "audio"): TTFT and tok/s of one chat request

    @property
    def acceptance(self) -> float | None:
        if not self.draft_n:
            return None
        return (self.draft_n_accepted or 0) / self.draft_n

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["acceptance"] = self.acceptance
        return data


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


def check(
    runner: SshRunner | LocalRunner,
    port: int,
    expect_drafts: bool,
    timeout: float = 120.0,
    alive: Callable[[], bool] | None = None,
    n_predict: int = 24,
    engine: str = "llama.cpp",
    model: str = "",
    gpu: GpuPolicy = "none",
    log_file: str = "",
    media: Sequence[str] = (),
    chat: bool = False,
) -> Health:
    """/health answers, then one greedy completion through ``engine``'s API shows tokens (and drafts),
    and a CUDA build's server log (``log_file``) shows whether it used the GPU, as ``gpu`` demands.

    ``model``: the name the engine serves the model under (vLLM's --served-model-name)."""
    from edgekit.deploy.service import log_tail
    from edgekit.engines import get_engine

    try:
        ready = wait_ready(runner, port, timeout, alive)
    except TimeoutError as exc:
        return Health(False, str(exc))
    health = get_engine(engine).completion(runner, port, model, HEALTH_PROMPT, n_predict, timeout, chat)
    health.seconds_to_ready = round(ready, 2)
    if not health.ok:
        return health
    if health.tokens <= 0:
        health.ok, health.reason = False, "the completion generated no tokens"
    elif expect_drafts and not health.draft_n:
        health.ok, health.reason = False, "a drafter is configured but the server drafted no tokens (draft_n = 0)"
    elif gpu != "none":
        health = apply_gpu_policy(health, gpu, log_tail(runner, log_file, 400))
    if health.ok and media:
        health = media_checks(runner, port, health, media, timeout)
    return health


def check_release(runner: SshRunner | LocalRunner, manifest: dict, log_file: str, timeout: float = 120.0,
                  alive: Callable[[], bool] | None = None) -> Health:
    """:func:`check` with everything a release's ``release.json`` says about how to check it."""
    return check(runner, int(manifest.get("port", 8080)), bool(manifest.get("drafter")), timeout=timeout, alive=alive,
                 engine=manifest.get("engine", "llama.cpp"), model=manifest.get("recipe", ""),
                 gpu=manifest.get("gpu", "none"), log_file=log_file, media=manifest.get("media") or (),
                 chat=bool(manifest.get("chat")))


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


def llama_completion(runner: SshRunner | LocalRunner, port: int, prompt: str, n_predict: int,
                     timeout: float, chat: bool = False) -> Health:
    """llama-server's /completion, or with ``chat`` its /v1/chat/completions (the model's chat template
    applied by the server): their `timings` carry tokens, tok/s and the draft counts."""
    path, payload = completion_request(prompt, n_predict, chat)
    try:
        resp = request(runner, port, "POST", path, payload, timeout=timeout)
    except ConnectionError as exc:
        return Health(False, f"the completion request failed: {exc}")
    if resp.status != 200:
        return Health(False, f"the completion request answered {resp.status}: {resp.body[:200]!r}")
    data = resp.json()
    timings = data.get("timings") or {}
    return Health(
        ok=True,
        reason="healthy",
        tokens=int(timings.get("predicted_n") or data.get("tokens_predicted") or 0),
        tokens_per_second=timings.get("predicted_per_second"),
        draft_n=timings.get("draft_n"),
        draft_n_accepted=timings.get("draft_n_accepted"),
        text=answer_text(data, chat),
        method="chat completion" if chat else "completion",
    )


def gpu_use(log_text: str) -> tuple[bool, str]:
    """Did the (last) server start find a CUDA device? From ggml-cuda's start-up line in its log."""
    found = _CUDA_INIT.findall(log_text)
    if not found:
        return False, "not used: the server log has no CUDA start-up line"
    line, count = found[-1]
    if count and int(count) > 0:
        return True, f"used ({count} CUDA device{'s' if int(count) > 1 else ''})"
    return False, f"not used: {line.removeprefix('failed to initialize CUDA: ') or line}; the server runs on the CPU"


def apply_gpu_policy(health: Health, policy: GpuPolicy, log_text: str) -> Health:
    if policy == "none" or not health.ok:
        return health
    used, health.gpu = gpu_use(log_text)
    if not used and policy == "required":
        health.ok, health.reason = False, f"the GPU was {health.gpu}"
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
