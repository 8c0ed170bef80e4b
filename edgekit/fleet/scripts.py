"""Board-side programs the Ansible roles run, handed to the playbook in the plan file.

The release layout and the unit install are edgekit's own shell (edgekit.remote.releases,
edgekit.deploy.service), passed through unchanged so a board updated by Ansible looks exactly like
one updated by `edgekit deploy`. Two small stdlib Python programs are the fleet's own: STATE_PY
(the board's release state as JSON) and HEALTH_PY (edgekit's health check, run on the board).
Values only ever arrive as arguments; the roles quote every argument (Jinja's `quote` = shlex).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable

from edgekit.agent.load import _SPEC_COUNTER
from edgekit.deploy import service
from edgekit.release import probes
from edgekit.release.health import CUDA_INIT
from edgekit.remote import boardscripts, releases

# `python3 -c STATE_PY BASE [RELEASE] [UNIT]`: current, serving, releases (oldest first, as
# releases.layout sorts them), the manifests of current/previous/RELEASE, whether UNIT is active,
# and the sudo prefix edgekit uses (none as root). Python >= 3.6: JetPack 4's python3.
STATE_PY = r"""
import json, os, subprocess, sys

base = os.path.expanduser(sys.argv[1]).rstrip("/") or "/"
want = sys.argv[2] if len(sys.argv) > 2 else ""
unit = sys.argv[3] if len(sys.argv) > 3 else ""
sudo = [] if os.getuid() == 0 else ["sudo", "-n"]

def text(path):
    try:
        with open(path) as fh:
            return fh.read().strip() or None
    except (OSError, ValueError):
        return None

def manifest(rid):
    if not rid:
        return {}
    try:
        with open(os.path.join(base, "releases", rid, "release.json")) as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return {}
    data.pop("files", None)
    return data

try:
    link = os.readlink(os.path.join(base, "current"))
    current = link[len("releases/"):] if link.startswith("releases/") else link
except OSError:
    current = None
found = []
try:
    for name in os.listdir(os.path.join(base, "releases")):
        path = os.path.join(base, "releases", name)
        if not name.startswith(".") and os.path.isdir(path):
            found.append((int(os.stat(path).st_mtime), name))
except OSError:
    pass
ids = [name for _, name in sorted(found)]
previous = ids[ids.index(current) - 1] if current in ids and ids.index(current) > 0 else None
active = False
if unit:
    try:
        active = subprocess.call(sudo + ["systemctl", "is-active", "--quiet", unit],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) == 0
    except OSError:
        active = False
print(json.dumps({
    "base": base, "current": current, "serving": text(os.path.join(base, "serving")), "releases": ids,
    "previous": previous, "has_release": bool(want) and want in ids, "active": active, "sudo": sudo,
    "board_root": os.environ.get("EDGEKIT_BOARD_ROOT", ""),
    "manifests": {"current": manifest(current), "previous": manifest(previous), "release": manifest(want)},
}))
"""

# `python3 -c HEALTH_PY PORT EXPECT_DRAFTS(0|1) TIMEOUT N_PREDICT PROMPT UNIT [ENGINE MODEL GPU LOG [CHAT MEDIA]]`:
# edgekit's health check (edgekit.deploy.health.check) run on the board: GET /health until 200 (failing
# fast once UNIT is no longer active), then one greedy completion in ENGINE's dialect (llama.cpp and
# litert-lm: /completion and its `timings`; vllm: /v1/completions for MODEL, drafts from /metrics read
# before and after) that must show tokens, and drafts when a drafter is configured; with GPU "required"
# or "optional", the server log LOG must show ggml-cuda finding a device (required: else it fails). CHAT "1":
# the completion goes through the model's chat template (/v1/chat/completions, every engine); MEDIA
# ("image,audio"): each kind is sent too (the host's image and second of audio) and must be answered.
# Prints the Health as JSON; the exit status is always 0.
HEALTH_PY = r"""
import json, os, re, socket, subprocess, sys, time

port, expect, timeout = int(sys.argv[1]), sys.argv[2] == "1", float(sys.argv[3])
n_predict, prompt, unit = int(sys.argv[4]), sys.argv[5], sys.argv[6]
engine, model = (sys.argv[7], sys.argv[8]) if len(sys.argv) > 8 else ("llama.cpp", "")
gpu, log = (sys.argv[9], sys.argv[10]) if len(sys.argv) > 10 else ("none", "")
chat, media = (sys.argv[11] == "1", [k for k in sys.argv[12].split(",") if k]) if len(sys.argv) > 12 else (False, [])
sudo = [] if os.getuid() == 0 else ["sudo", "-n"]
COUNTER = re.compile(@SPEC_COUNTER@, re.M)
CUDA_INIT = re.compile(@CUDA_INIT@)

def alive():
    try:
        return subprocess.call(sudo + ["systemctl", "is-active", "--quiet", unit],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) == 0
    except OSError:
        return True

# HTTP/1.1 over a plain socket, one request a connection: http.client's imports (email, ssl) cost the
# board ~25 ms of CPU per check, more than the check's own work on a small model.
def request(method, path, payload, wait):
    body = json.dumps(payload).encode() if payload is not None else b""
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=wait)
    except OSError as exc:
        raise ConnectionError("nothing answers on the board's port %d (%s)" % (port, exc))
    head = ("%s %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
            "Connection: close\r\n\r\n" % (method, path, port, len(body)))
    data = []
    try:
        sock.sendall(head.encode("ascii") + body)
        while True:
            part = sock.recv(65536)
            if not part:
                break
            data.append(part)
    except OSError as exc:
        raise ConnectionError("the board's port %d broke off the request (%s)" % (port, exc))
    finally:
        sock.close()
    head, sep, rest = b"".join(data).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = lines[0].split(" ", 2)
    if not sep or len(status) < 2 or not status[0].startswith("HTTP/") or not status[1].isdigit():
        raise ConnectionError("the board's port %d broke off the request (no HTTP answer: %r)" % (port, head[:80]))
    fields = dict((k.strip().lower(), v.strip().lower()) for k, _, v in (ln.partition(":") for ln in lines[1:]))
    if "chunked" in fields.get("transfer-encoding", ""):
        rest = unchunk(rest)
    elif fields.get("content-length", "").isdigit():
        rest = rest[:int(fields["content-length"])]
    return int(status[1]), rest

def unchunk(raw):
    out, at = [], 0
    while True:
        end = raw.find(b"\r\n", at)
        try:
            size = int(raw[at:end].split(b";")[0], 16) if end >= 0 else 0
        except ValueError:
            raise ConnectionError("the board's port %d sent a broken chunked body" % port)
        if size <= 0:
            return b"".join(out)
        out.append(raw[end + 2:end + 2 + size])
        at = end + 2 + size + 2

def result(ok, reason, ready=None, **more):
    out = {"ok": ok, "reason": reason, "seconds_to_ready": ready, "tokens": 0, "tokens_per_second": None,
           "draft_n": None, "draft_n_accepted": None, "text": "", "gpu": None}
    out.update(more)
    out["acceptance"] = (out["draft_n_accepted"] or 0) / out["draft_n"] if out["draft_n"] else None
    print(json.dumps(out))
    sys.exit(0)

def counters():
    status, body = request("GET", "/metrics", None, 30)
    out = {}
    for kind, value in COUNTER.findall(body.decode("utf-8", "replace") if status == 200 else ""):
        out[kind] = out.get(kind, 0.0) + float(value)
    return out

def llama_completion():
    path, payload = completion_request(prompt, n_predict, chat)  # chat: through the model's template
    status, body = request("POST", path, payload, timeout)
    if status != 200:
        return status, body, {}
    data = json.loads(body.decode() or "null") or {}
    timings = data.get("timings") or {}
    text = answer_text(data, chat)
    return status, body, {"tokens": int(timings.get("predicted_n") or data.get("tokens_predicted") or 0),
                          "tokens_per_second": timings.get("predicted_per_second"),
                          "draft_n": timings.get("draft_n"), "draft_n_accepted": timings.get("draft_n_accepted"),
                          "text": text, "method": "chat completion" if chat else "completion"}

@MEDIA_PROBES@

def media_completion(kind):
    status, body = request("POST", "/v1/chat/completions", chat_payload(kind, 16), timeout)
    if status != 200:
        return {"ok": False, "reason": "the %s request answered %d: %r" % (kind, status, body[:200])}
    return media_outcome(kind, json.loads(body.decode() or "null") or {})

def vllm_completion():
    path, payload = openai_request(model, prompt, n_predict, chat)  # chat: through the model's template
    before, t0 = counters(), time.monotonic()
    status, body = request("POST", path, payload, timeout)
    seconds = time.monotonic() - t0
    if status != 200:
        return status, body, {}
    after, data = counters(), json.loads(body.decode() or "null") or {}
    tokens = int((data.get("usage") or {}).get("completion_tokens") or 0)
    drafted = int(after.get("draft", 0) - before.get("draft", 0))
    return status, body, {"tokens": tokens, "tokens_per_second": round(tokens / seconds, 2) if seconds else None,
                          "draft_n": drafted or None,
                          "draft_n_accepted": int(after.get("accepted", 0) - before.get("accepted", 0))
                          if drafted else None,
                          "text": answer_text(data, chat, True), "method": "chat completion" if chat else "completion"}

def gpu_use():
    try:
        with open(log, "rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - 65536))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        text = ""
    found = CUDA_INIT.findall(text)
    if not found:
        return False, "not used: the server log has no CUDA start-up line"
    line, count = found[-1]
    if count and int(count) > 0:
        return True, "used (%s CUDA device%s)" % (count, "s" if int(count) > 1 else "")
    reason = line[len("failed to initialize CUDA: "):] if line.startswith("failed to initialize CUDA: ") else line
    return False, "not used: %s; the server runs on the CPU" % reason

# /health every 50 ms (a refused connection costs nothing); whether the unit still runs once a second,
# since asking systemctl starts a process.
start = asked = time.monotonic()
last = "no answer"
while True:
    now = time.monotonic()
    if now - start >= timeout:
        result(False, "not ready after %.0f s (%s)" % (timeout, last))
    try:
        status, _ = request("GET", "/health", None, 5)
        if status == 200:
            break
        last = "/health answered %d" % status
    except ConnectionError as exc:
        last = str(exc)
    if now - asked >= 1.0:
        asked = now
        if not alive():
            result(False, "the server exited before it was ready (%s)" % last)
    time.sleep(0.05)
ready = round(time.monotonic() - start, 2)
try:
    status, body, more = vllm_completion() if engine == "vllm" else llama_completion()
except ConnectionError as exc:
    result(False, "the completion request failed: %s" % exc, ready)
if status != 200:
    result(False, "the completion request answered %d: %r" % (status, body[:200]), ready)
if more["tokens"] <= 0:
    result(False, "the completion generated no tokens", ready, **more)
if expect and not more["draft_n"]:
    result(False, "a drafter is configured but the server drafted no tokens (draft_n = 0)", ready, **more)
if gpu in ("required", "optional"):
    used, more["gpu"] = gpu_use()
    if not used and gpu == "required":
        result(False, "the GPU was %s" % more["gpu"], ready, **more)
if media:
    try:
        more["media"] = {kind: media_completion(kind) for kind in media}
    except ConnectionError as exc:
        result(False, "the media request failed: %s" % exc, ready, **more)
    failed = [m["reason"] for m in more["media"].values() if not m["ok"]]
    if failed:
        result(False, failed[0], ready, **more)
result(True, "healthy", ready, **more)
"""
# The patterns the host's health check and the agent's load read, not a copy of them.
HEALTH_PY = HEALTH_PY.replace("@SPEC_COUNTER@", repr(_SPEC_COUNTER.pattern)).replace("@CUDA_INIT@",
                                                                                     repr(CUDA_INIT.pattern))
# The requests, image and audio the host's check sends, made by the same (standard-library) code.
def _plain_source(*funcs: Callable[..., object]) -> str:
    """The functions' source without annotations: the board's Python may be 3.6."""
    tree = ast.parse("\n\n".join(textwrap.dedent(inspect.getsource(f)) for f in funcs))
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            node.returns = None
            for arg in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs):
                arg.annotation = None
    return ast.unparse(tree)


HEALTH_PY = HEALTH_PY.replace("@MEDIA_PROBES@", "import base64, io, math, struct, wave, zlib\n"
                              f"MEDIA_PROMPT = {probes.MEDIA_PROMPT!r}\n"
                              + _plain_source(probes.completion_request, probes.openai_request, probes.answer_text,
                                              probes.media_outcome, probes.probe_png,
                                              probes.probe_wav, probes.content_part, probes.chat_payload))

# `sh -c INVENTORY_RO sh STORE SHA...`: INVENTORY_SH without creating the store (for --check).
INVENTORY_RO = r"""
d="$1"; shift
[ -d "$d" ] || { echo "free $(df -Pk / | awk 'NR==2 {print $4}')"; exit 0; }
""" + boardscripts.INVENTORY_LIST_SH

# `python3 -c PLACE_PY STORE [SHA MODE]...`: after an upload, hash each `<sha>.part` on the board
# (one process for all: cheaper than a hashing tool per file), make the good ones durable, and rename
# them into place (rename(2): atomic) with their MODE; delete the others. Prints `ok SHA` or
# `bad SHA HEX` per blob. The Ansible twin of transfer._Push.settle. After `--`, a command to run in
# its place once every blob is good (the release's CREATE_PY): one round trip for both.
# Durable with one syncfs(2) of the store's filesystem, not an fsync per blob: a release has dozens of
# small blobs, and each fsync is a journal commit that eight boards' uploads queue behind.
PLACE_PY = r"""
import ctypes, hashlib, os, sys

store, args = sys.argv[1], sys.argv[2:]
then = []
if "--" in args:
    cut = args.index("--")
    args, then = args[:cut], args[cut + 1:]


def durable(parts):
    fd = os.open(store, os.O_RDONLY)
    try:
        if ctypes.CDLL(None, use_errno=True).syncfs(fd) == 0:
            return
    except (OSError, AttributeError):
        pass
    finally:
        os.close(fd)
    for part in parts:  # no syncfs here: each file on its own
        pfd = os.open(part, os.O_RDONLY)
        try:
            os.fsync(pfd)
        finally:
            os.close(pfd)


good, all_good = [], True
for i in range(0, len(args) - 1, 2):
    sha, mode = args[i], int(args[i + 1], 8)
    part = os.path.join(store, sha + ".part")
    digest = hashlib.sha256()
    try:
        fd = os.open(part, os.O_RDONLY)
    except OSError:
        print("bad", sha, "missing")
        all_good = False
        continue
    try:
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            digest.update(chunk)
    finally:
        os.close(fd)
    if digest.hexdigest() == sha:
        good.append((sha, mode, part))
    else:
        os.unlink(part)
        print("bad", sha, digest.hexdigest())
        all_good = False
if good:
    durable([part for _, _, part in good])  # on disk before any gets its final name
for sha, mode, part in good:
    os.chmod(part, mode)
    os.replace(part, os.path.join(store, sha))
    print("ok", sha)
dfd = os.open(store, os.O_RDONLY)
try:
    os.fsync(dfd)  # the renames, durable
finally:
    os.close(dfd)
if then and all_good:
    sys.stdout.flush()
    if then[:2] == ["python3", "-c"]:  # a Python program: run here, not in a second interpreter
        sys.argv = ["-c"] + then[3:]
        exec(compile(then[2], "<string>", "exec"), {"__name__": "__main__"})
    else:
        os.execvp(then[0], then)
"""

# releases.mark_serving's command, which is inline there.
SERVING_SH = 'printf "%s\\n" "$2" > "$1/.serving.new" && mv -f "$1/.serving.new" "$1/serving"'
# Service.remove's last command, inline there too.
UNIT_RM_SH = 'rm -f "${EDGEKIT_BOARD_ROOT:-}/etc/systemd/system/$1"'


def scripts() -> dict[str, str]:
    """Every board-side program the roles use, by the name the roles know it by."""
    return {
        "state": STATE_PY,
        "health": HEALTH_PY,
        "create": releases.CREATE_PY,
        "switch": releases.SWITCH_SH,
        "serving": SERVING_SH,
        "record_health": releases.RECORD_HEALTH_SH,
        "prune": releases.PRUNE_SH,
        "unit_install": service.INSTALL_UNIT_SH,
        "unit_rm": UNIT_RM_SH,
        "inventory": boardscripts.INVENTORY_SH,
        "inventory_ro": INVENTORY_RO,
        "place": PLACE_PY,
    }
