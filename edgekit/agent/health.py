"""`health`: is a release's server healthy? edgekit's one health check, run on the board.

    health --port P [--drafter] [--timeout S] [--n-predict N] [--prompt TEXT] [--unit UNIT]
           [--api llama|openai] [--model NAME] [--draft-counters D,A] [--gpu none|required|optional]
           [--log FILE] [--chat] [--media image,audio]

GET /health until it answers 200 (failing fast once ``--unit`` is no longer active), then one greedy
completion in the server's dialect must show tokens, and drafts with ``--drafter``:
``--api llama`` (llama-server, and LiteRT-LM behind the agent's front) reads ``/completion``'s `timings`;
``--api openai`` (vLLM's dialect) asks ``/v1/completions`` for ``--model`` and reads the draft counters its
engine names (``--draft-counters DRAFTED,ACCEPTED``: the release's ``draft_counters``) from ``/metrics`` before and
after. ``--chat``: the prompt goes through the model's chat template
(``/v1/chat/completions``). ``--gpu required|optional``: the server log ``--log`` must show ggml-cuda
finding a device (required: else the check fails; optional: the fallback is reported). ``--media``: an
image (a 64×64 gradient PNG) and a second of audio (a 440 Hz tone, 16 kHz WAV) are each sent as OpenAI
content parts and must be answered.

Prints the Health as one JSON line; exits 0 whatever it found (2: bad arguments). `edgekit deploy`,
status, rollback and the fleet's roles all run this verb of the agent (the zipapp of the running edgekit, so a
board is checked by this edgekit's program whichever release it serves), the activation program calls
:func:`check`, and the host imports its requests and patterns from it: one spelling of the check. Standard
library only (Python 3.8).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import time
from typing import Any, Callable, Dict, Sequence, Tuple

HEALTH_PROMPT = "The three primary colours are"
MEDIA_PROMPT = {"image": "What is in this picture?", "audio": "What do you hear?"}
# ggml-cuda's first words at start-up (the last start's line wins: the log is appended to).
CUDA_INIT = re.compile(r"ggml_cuda_init: (found (\d+) CUDA devices?|failed to initialize CUDA: [^\n]*)")


# --- what the check sends (the host's bench sends the same media) -------------------------------------------

def completion_request(prompt: str, n_predict: int, chat: bool) -> tuple[str, dict[str, Any]]:
    """(path, payload) of one greedy llama-server completion; ``chat``: as a user turn, through the model's
    chat template (/v1/chat/completions), else the raw prompt (/completion)."""
    if chat:
        return "/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}], "max_tokens": n_predict,
                                        "temperature": 0.0, "cache_prompt": False, "seed": 0}
    return "/completion", {"prompt": prompt, "n_predict": n_predict, "temperature": 0.0, "cache_prompt": False,
                           "seed": 0}


def openai_request(model: str, prompt: str, n_predict: int, chat: bool) -> tuple[str, dict[str, Any]]:
    """(path, payload) of one greedy vLLM completion: ``chat`` through the model's chat template
    (/v1/chat/completions), else the raw prompt (/v1/completions); always n_predict tokens."""
    common = {"model": model, "max_tokens": n_predict, "temperature": 0.0, "seed": 0, "ignore_eos": True}
    if chat:
        return "/v1/chat/completions", dict(common, messages=[{"role": "user", "content": prompt}])
    return "/v1/completions", dict(common, prompt=prompt)


def answer_text(data: dict[str, Any], chat: bool, openai: bool = False) -> str:
    """The generated text of a completion body: a chat message, an OpenAI completion, or llama-server's."""
    choice = (data.get("choices") or [{}])[0]
    if chat:
        return str((choice.get("message") or {}).get("content") or "")
    return str((choice.get("text") if openai else data.get("content")) or "")


def media_outcome(kind: str, data: dict[str, Any]) -> dict[str, Any]:
    """One media answer (a /v1/chat/completions body) as the checks report it: TTFT (llama-server's prompt_ms:
    the media encoded and the prompt read), prompt tokens, tokens, tok/s after, drafts, the text's start."""
    t = data.get("timings") or {}
    tokens = int(t.get("predicted_n") or (data.get("usage") or {}).get("completion_tokens") or 0)
    message = (data.get("choices") or [{}])[0].get("message") or {}
    return {"ok": tokens > 0, "reason": "answered" if tokens > 0 else "the " + kind + " request generated no tokens",
            "ttft_ms": t.get("prompt_ms"), "prompt_tokens": t.get("prompt_n"), "tokens": tokens,
            "tokens_per_second": t.get("predicted_per_second"), "draft_n": t.get("draft_n"),
            "draft_n_accepted": t.get("draft_n_accepted"), "text": str(message.get("content") or "")[:80]}


def probe_png(size: int = 64) -> bytes:
    import struct
    import zlib

    rows = b"".join(b"\x00" + bytes(v for x in range(size) for v in (x * 255 // size, y * 255 // size, 128))
                    for y in range(size))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows, 9)) + chunk(b"IEND", b"")


def probe_wav(seconds: float = 1.0, rate: int = 16000) -> bytes:
    import io
    import math
    import struct
    import wave

    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(b"".join(struct.pack("<h", int(8000 * math.sin(2 * math.pi * 440 * i / rate)))
                               for i in range(int(seconds * rate))))
    return buf.getvalue()


def content_part(kind: str) -> dict[str, Any]:
    import base64

    if kind == "image":
        return {"type": "image_url",
                "image_url": {"url": "data:image/png;base64," + base64.b64encode(probe_png()).decode()}}
    if kind == "audio":
        return {"type": "input_audio", "input_audio": {"data": base64.b64encode(probe_wav()).decode(), "format": "wav"}}
    raise ValueError(f"no probe for {kind!r}")


def chat_payload(kind: str, max_tokens: int) -> dict[str, Any]:
    """A greedy chat request with one ``kind`` part and a short question."""
    parts = [content_part(kind), {"type": "text", "text": MEDIA_PROMPT[kind]}]
    return {"messages": [{"role": "user", "content": parts}], "max_tokens": max_tokens, "temperature": 0.0,
            "seed": 0, "cache_prompt": False}


def gpu_use(log_text: str) -> tuple[bool, str]:
    """Did the (last) server start find a CUDA device? From ggml-cuda's start-up line in its log."""
    found = CUDA_INIT.findall(log_text)
    if not found:
        return False, "not used: the server log has no CUDA start-up line"
    line, count = found[-1]
    if count and int(count) > 0:
        return True, f"used ({count} CUDA device{'s' if int(count) > 1 else ''})"
    prefix = "failed to initialize CUDA: "
    reason = line[len(prefix):] if line.startswith(prefix) else line
    return False, "not used: %s; the server runs on the CPU" % (reason or line)


def gpu_policy(policy: str, log_text: str) -> tuple[str | None, str]:
    """(what the Health says of the GPU, why the check fails or ""). "none": a CPU build, not asked;
    "required": a CUDA build on a board with a GPU driver, where a CPU fallback fails the check; "optional":
    a CUDA build on a board without one (an emulated board), where the fallback is only reported."""
    if policy == "none":
        return None, ""
    used, said = gpu_use(log_text)
    return said, f"the GPU was {said}" if not used and policy == "required" else ""


# --- talking to the server ---------------------------------------------------------------------------------

class Server:
    """HTTP/1.1 to 127.0.0.1:port over a plain socket, one request a connection: http.client's imports
    (email, ssl) cost the board ~25 ms of CPU per check, more than the check's own work on a small model."""

    def __init__(self, port: int, key_file: str = "") -> None:
        self.port = port
        # The board's API key (runtime.auth: key), read from its file: it never passes through argv.
        self.auth = f"Authorization: Bearer {read_key(key_file)}\r\n" if key_file else ""

    def request(self, method: str, path: str, payload: dict[str, Any] | None, wait: float) -> tuple[int, bytes]:
        body = json.dumps(payload).encode() if payload is not None else b""
        try:
            sock = socket.create_connection(("127.0.0.1", self.port), timeout=wait)
        except OSError as exc:
            raise ConnectionError(f"nothing answers on the board's port {self.port} ({exc})") from None
        head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n{self.auth}Connection: close\r\n\r\n")
        data = []
        try:
            sock.sendall(head.encode("ascii") + body)
            while True:
                part = sock.recv(65536)
                if not part:
                    break
                data.append(part)
        except OSError as exc:
            raise ConnectionError(f"the board's port {self.port} broke off the request ({exc})") from None
        finally:
            sock.close()
        return self._parse(b"".join(data))

    def _parse(self, raw: bytes) -> tuple[int, bytes]:
        head, sep, rest = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = lines[0].split(" ", 2)
        if not sep or len(status) < 2 or not status[0].startswith("HTTP/") or not status[1].isdigit():
            raise ConnectionError(f"the board's port {self.port} broke off the request (no HTTP answer: "
                                  f"{head[:80]!r})")
        fields = {k.strip().lower(): v.strip().lower() for k, _, v in (ln.partition(":") for ln in lines[1:])}
        if "chunked" in fields.get("transfer-encoding", ""):
            rest = self._unchunk(rest)
        elif fields.get("content-length", "").isdigit():
            rest = rest[:int(fields["content-length"])]
        return int(status[1]), rest

    def _unchunk(self, raw: bytes) -> bytes:
        out, at = [], 0
        while True:
            end = raw.find(b"\r\n", at)
            try:
                size = int(raw[at:end].split(b";")[0], 16) if end >= 0 else 0
            except ValueError:
                raise ConnectionError(f"the board's port {self.port} sent a broken chunked body") from None
            if size <= 0:
                return b"".join(out)
            out.append(raw[end + 2:end + 2 + size])
            at = end + 2 + size + 2

    def json(self, method: str, path: str, payload: dict[str, Any] | None, wait: float) -> tuple[int, Any, bytes]:
        status, body = self.request(method, path, payload, wait)
        data = json.loads(body.decode() or "null") if status == 200 else None
        return status, data or {}, body


def read_key(path: str) -> str:
    with open(path) as fh:
        return fh.read().strip()


def server_of(args: argparse.Namespace) -> Server:
    """The server a check asks, with the key file its options name."""
    return Server(args.port, args.api_key_file)


def read_counters(text: str, names: Sequence[str]) -> dict[str, float]:
    """``{"draft": …, "accepted": …}`` from a Prometheus text of /metrics: the counters ``names`` (drafted,
    accepted: the engine names them), each summed over its labels, with or without the ``_total`` suffix."""
    if len(names) != 2:
        return {}
    alternatives = "|".join(re.escape(n) for n in names)
    pattern = re.compile("^(" + alternatives + r")(?:_total)?(?:\{[^}]*\})?\s+(\S+)$", re.MULTILINE)
    out: dict[str, float] = {}
    for name, value in pattern.findall(text):
        kind = "draft" if name == names[0] else "accepted"
        out[kind] = out.get(kind, 0.0) + float(value)
    return out


def spec_counters(server: Server, names: Sequence[str]) -> dict[str, float]:
    if len(names) != 2:
        return {}  # the engine names no counters: its drafts are not counted
    status, body = server.request("GET", "/metrics", None, 30)
    return read_counters(body.decode("utf-8", "replace") if status == 200 else "", names)


Outcome = Tuple[int, bytes, Dict[str, Any]]  # HTTP status, body, the Health's measured fields


def llama_completion(server: Server, args: argparse.Namespace) -> Outcome:
    """llama-server's /completion (``--chat``: /v1/chat/completions): its `timings` carry tokens, tok/s, drafts."""
    path, payload = completion_request(args.prompt, args.n_predict, args.chat)
    status, data, body = server.json("POST", path, payload, args.timeout)
    if status != 200:
        return status, body, {}
    timings = data.get("timings") or {}
    return status, body, {"tokens": int(timings.get("predicted_n") or data.get("tokens_predicted") or 0),
                          "tokens_per_second": timings.get("predicted_per_second"),
                          "draft_n": timings.get("draft_n"), "draft_n_accepted": timings.get("draft_n_accepted"),
                          "text": answer_text(data, args.chat)}


def openai_completion(server: Server, args: argparse.Namespace) -> Outcome:
    """vLLM's /v1/completions (``--chat``: /v1/chat/completions); tok/s over the whole request (vLLM reports no
    decode timing per request) and drafts from /metrics read just before and after."""
    path, payload = openai_request(args.model, args.prompt, args.n_predict, args.chat)
    counters = getattr(args, "draft_counters", None) or []
    before, t0 = spec_counters(server, counters), time.monotonic()
    status, data, body = server.json("POST", path, payload, args.timeout)
    seconds = time.monotonic() - t0
    if status != 200:
        return status, body, {}
    after = spec_counters(server, counters)
    tokens = int((data.get("usage") or {}).get("completion_tokens") or 0)
    drafted = int(after.get("draft", 0) - before.get("draft", 0))
    return status, body, {"tokens": tokens, "tokens_per_second": round(tokens / seconds, 2) if seconds else None,
                          "draft_n": drafted or None,
                          "draft_n_accepted": int(after.get("accepted", 0) - before.get("accepted", 0))
                          if drafted else None,
                          "text": answer_text(data, args.chat, openai=True)}


COMPLETIONS: dict[str, Callable[[Server, argparse.Namespace], Outcome]] = {
    "llama": llama_completion, "openai": openai_completion}


def media_completion(server: Server, kind: str, timeout: float, n_predict: int = 16) -> dict[str, Any]:
    try:
        status, data, body = server.json("POST", "/v1/chat/completions", chat_payload(kind, n_predict), timeout)
    except ConnectionError as exc:
        return {"ok": False, "reason": f"the {kind} request failed: {exc}"}
    if status != 200:
        return {"ok": False, "reason": f"the {kind} request answered {status}: {body[:200]!r}"}
    return media_outcome(kind, data)


# --- the check ---------------------------------------------------------------------------------------------

def unit_active(unit: str) -> bool:
    """``systemctl is-active`` needs no privilege; an unknown answer counts as alive (the timeout still holds)."""
    try:
        return subprocess.call(["systemctl", "is-active", "--quiet", unit],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) == 0
    except OSError:
        return True


def installed_unit(unit: str) -> str:
    """Where systemd keeps ``unit``'s file (under ``$EDGEKIT_BOARD_ROOT`` on a simulated board)."""
    return os.environ.get("EDGEKIT_BOARD_ROOT", "") + "/etc/systemd/system/" + unit


def unit_log(unit_file: str) -> str | None:
    """Where a unit file sends its server's output (StandardOutput=append:PATH): a release an older edgekit made
    logs elsewhere than this one's, and the unit is what says where."""
    try:
        with open(unit_file) as fh:
            for line in fh:
                if line.startswith("StandardOutput=append:"):
                    return line.split(":", 1)[1].strip().replace("%%", "%")
    except OSError:
        pass
    return None


def log_tail(path: str, size: int = 65536) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - size))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def wait_ready(server: Server, timeout: float, unit: str) -> tuple[float | None, str]:
    """Seconds until /health answers 200, or (None, why not). /health every 50 ms (a refused connection costs
    nothing); whether the unit still runs once a second, since asking systemctl starts a process."""
    start = asked = time.monotonic()
    last = "no answer"
    while True:
        now = time.monotonic()
        if now - start >= timeout:
            return None, f"not ready after {timeout:.0f} s ({last})"
        try:
            status, _ = server.request("GET", "/health", None, 5)
            if status == 200:
                return round(time.monotonic() - start, 2), ""
            last = f"/health answered {status}"  # 503 while the model loads
        except ConnectionError as exc:
            last = str(exc)
        if unit and now - asked >= 1.0:
            asked = now
            if not unit_active(unit):
                return None, f"the server exited before it was ready ({last})"
        time.sleep(0.05)


def unhealthy(reason: str, chat: bool = False) -> dict[str, Any]:
    """A Health that failed before any request: ``reason`` says why."""
    return {"ok": False, "reason": reason, "seconds_to_ready": None, "tokens": 0, "tokens_per_second": None,
            "draft_n": None, "draft_n_accepted": None, "text": "",
            "method": "chat completion" if chat else "completion", "gpu": None, "media": None, "acceptance": None}


def check(args: argparse.Namespace) -> dict[str, Any]:
    """The Health (edgekit.release.health.Health's fields, with its acceptance) of the server on ``args.port``."""
    out = _check(args)
    out["acceptance"] = (out["draft_n_accepted"] or 0) / out["draft_n"] if out["draft_n"] else None
    return out


def _check(args: argparse.Namespace) -> dict[str, Any]:
    try:
        server = server_of(args)
    except OSError as exc:
        return unhealthy(f"cannot read the API key file {args.api_key_file}: {exc.strerror}", args.chat)
    ready, why = wait_ready(server, args.timeout, args.unit)
    out = unhealthy(why, args.chat)
    out["seconds_to_ready"] = ready
    if ready is None:
        return out
    try:
        status, body, measured = COMPLETIONS[args.api](server, args)
    except ConnectionError as exc:
        return dict(out, reason=f"the completion request failed: {exc}")
    out.update(measured)
    if status != 200:
        return dict(out, reason=f"the completion request answered {status}: {body[:200]!r}")
    if out["tokens"] <= 0:
        return dict(out, reason="the completion generated no tokens")
    if args.drafter and not out["draft_n"]:
        return dict(out, reason="a drafter is configured but the server drafted no tokens (draft_n = 0)")
    log = (unit_log(installed_unit(args.unit)) if args.unit else None) or args.log
    out["gpu"], failed_gpu = gpu_policy(args.gpu, log_tail(log) if log else "")
    if failed_gpu:
        return dict(out, reason=failed_gpu)
    if args.media:
        out["media"] = {kind: media_completion(server, kind, args.timeout) for kind in args.media}
        failed = [m["reason"] for m in out["media"].values() if not m["ok"]]
        if failed:
            return dict(out, reason=failed[0])
    return dict(out, ok=True, reason="healthy")


def command_args(port: int, *, unit: str, log: str, draft_counters: Sequence[str] = (), **check: Any) -> list[str]:
    """This program's arguments for one check: what edgekit's host side and the fleet's roles both send.
    ``draft_counters`` goes to this verb alone: a release's activation program reads its release's own."""
    argv = ["--port", str(port)]
    for flag, value in (("--unit", unit), ("--log", log), ("--draft-counters", ",".join(draft_counters))):
        if value:
            argv += [flag, value]
    return argv + check_options(**check)


def check_options(*, drafter: bool, timeout: float, n_predict: int, prompt: str, api: str, model: str, gpu: str,
                  chat: bool, media: list[str], key_file: str = "") -> list[str]:
    """The check's options other than where (add_check_arguments): the activation program takes these too."""
    argv = ["--timeout", f"{timeout:g}", "--n-predict", str(n_predict), "--prompt", prompt, "--api", api,
            "--gpu", gpu]
    for flag, value in (("--model", model), ("--media", ",".join(media)), ("--api-key-file", key_file)):
        if value:
            argv += [flag, value]
    return argv + (["--drafter"] if drafter else []) + (["--chat"] if chat else [])


def add_check_arguments(p: argparse.ArgumentParser) -> None:
    """The check's options other than where (--port, --unit, --log): the activation program takes them too."""
    p.add_argument("--drafter", action="store_true", help="a drafter is configured: the completion must draft")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--n-predict", type=int, default=24)
    p.add_argument("--prompt", default=HEALTH_PROMPT)
    p.add_argument("--api", choices=sorted(COMPLETIONS), default="llama")
    p.add_argument("--model", default="", help="the name the server serves the model under (--api openai)")
    p.add_argument("--gpu", choices=["none", "required", "optional"], default="none")
    p.add_argument("--chat", action="store_true")
    p.add_argument("--media", type=lambda s: [k for k in s.split(",") if k], default=[],
                   help="comma-separated kinds its mmproj takes: image, audio")
    p.add_argument("--api-key-file", default="", help="the file holding the server's API key (runtime.auth: key)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The `health` verb's arguments: where (--port, --unit, --log) and the check's options."""
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--unit", default="", help="the systemd unit serving it: fail fast once it stops")
    p.add_argument("--log", default="", help="the server's log (for --gpu)")
    p.add_argument("--draft-counters", type=lambda s: [n for n in s.split(",") if n], default=[],
                   help="--api openai: the /metrics counters of drafted and accepted tokens, comma-separated")
    add_check_arguments(p)


def unknown_media(args: argparse.Namespace) -> list[str]:
    return [k for k in args.media if k not in MEDIA_PROMPT]
