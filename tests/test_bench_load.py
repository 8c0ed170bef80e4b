"""The agent's `load` against a stand-in llama-server that streams like the real one (chunked SSE).

The stand-in delays its first token by a known time, so TTFT is checked against a known value;
it tokenizes one token per character, so context lengths are checked exactly.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import typing
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from test_agent_py38 import _python38
from test_agent_support import AGENT

PROMPTS = Path(__file__).resolve().parents[1] / "edgekit" / "data" / "prompts" / "default.json"
FIRST_TOKEN_S = 0.12
TOKEN_S = 0.004
BOS = 1


class FakeLlama(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    token_s = TOKEN_S
    completions: typing.ClassVar[list[dict]] = []

    def log_message(self, *_args: object) -> None:
        pass

    def _json(self, obj: object, status: int = 200) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _body(self) -> dict:
        n = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(n) or b"{}")

    def do_GET(self) -> None:
        if self.path == "/props":
            self._json({"default_generation_settings": {"n_ctx": 4096}})
        else:
            self._json({"error": "not found"}, 404)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def do_POST(self) -> None:
        req = self._body()
        if self.path == "/tokenize":
            toks = [ord(c) for c in req["content"]]
            self._json({"tokens": ([BOS] if req.get("add_special") else []) + toks})
        elif self.path == "/detokenize":
            self._json({"content": "".join(chr(t) for t in req["tokens"])})
        elif self.path == "/apply-template":
            self._json({"prompt": "<u>" + req["messages"][0]["content"] + "</u>"})
        elif self.path == "/completion":
            type(self).completions.append(req)
            n = int(req["n_predict"])
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                time.sleep(FIRST_TOKEN_S)
                for i in range(n):
                    if i:
                        time.sleep(self.token_s)
                    self._chunk(b'data: {"content":"x","tokens":[7],"stop":false}\n\n')
                final = {"content": "", "stop": True, "stop_type": "limit", "tokens_predicted": n,
                         "timings": {"prompt_n": len(req["prompt"]), "predicted_n": n, "predicted_per_second": 250.0,
                                     "draft_n": 3 * n, "draft_n_accepted": n}}
                self._chunk(b"data: " + json.dumps(final).encode() + b"\n\n")
                self._chunk(b"")
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client hung up (as the load does when stopped)
        else:
            self._json({"error": "not found"}, 404)


@pytest.fixture
def server() -> Iterator[int]:
    FakeLlama.completions = []
    FakeLlama.token_s = TOKEN_S
    srv = ThreadingHTTPServer(("127.0.0.1", 0), FakeLlama)
    srv.daemon_threads = True
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        yield srv.server_address[1]
    finally:
        srv.shutdown()
        srv.server_close()


def _load(port: int, *args: str, python: str = sys.executable, out: Path | None = None,
          timeout: float = 60) -> subprocess.CompletedProcess:
    argv = [python, str(AGENT), "load", "--port", str(port), "--prompts", str(PROMPTS), *args]
    if out is not None:
        argv += ["--out", str(out)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def test_load_measures_ttft_tokens_drafts_and_covers_every_category(server: int, tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    res = _load(server, "--concurrency", "2", "--requests", "6", "--n-gen", "10", "--warmup", "1", out=out)
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["tokens"] == 60 and summary["errors"] == 0 and not summary["interrupted"]
    data = json.loads(out.read_text())
    reqs = data["requests"]
    assert len(reqs) == 6 and {r["category"] for r in reqs} == {"code", "qa", "chat", "math", "repetitive"}
    for r in reqs:
        assert FIRST_TOKEN_S <= r["ttft_s"] < FIRST_TOKEN_S + 0.15, r
        assert r["latency_s"] >= r["ttft_s"] + 9 * TOKEN_S
        assert (r["tokens"], r["draft_n"], r["draft_n_accepted"]) == (10, 30, 10)
        assert data["window"]["start"] <= r["start"] < r["end"] <= data["window"]["end"]
    # Two requests were in flight at once: the window is about half the sum of the latencies.
    assert data["window"]["duration_s"] < 0.75 * sum(r["latency_s"] for r in reqs)
    assert data["warmup"]["requests"] == 2 and data["warmup"]["end"] <= data["window"]["start"]
    assert data["tokens_per_second"] == pytest.approx(60 / data["window"]["duration_s"], rel=1e-3)
    # Streaming, greedy, no prompt cache; prompts go as token ids through the chat template.
    sent = FakeLlama.completions[-1]
    assert sent["stream"] is True and sent["temperature"] == 0.0 and sent["cache_prompt"] is False
    assert sent["prompt"][0] == BOS and "".join(map(chr, sent["prompt"][1:])).startswith("<u>")
    assert data["chat_template"] is True


def test_a_sampled_load_seeds_each_request_alike_in_every_run(server: int, tmp_path: Path) -> None:
    seeds = []
    for offset in ("1", "1", "2"):  # a drafter's and a baseline's run of one repetition, then the next one
        FakeLlama.completions = []
        res = _load(server, "--requests", "5", "--n-gen", "2", "--warmup", "0", "--temperature", "0.7",
                    "--offset", offset, out=tmp_path / "l.json")
        assert res.returncode == 0, res.stderr
        sent = sorted(FakeLlama.completions, key=lambda c: c["seed"])
        assert all(c["temperature"] == 0.7 for c in sent)
        data = json.loads((tmp_path / "l.json").read_text())
        assert data["temperature"] == 0.7
        assert sorted(r["seed"] for r in data["requests"]) == [c["seed"] for c in sent]
        seeds.append({r["i"]: r["seed"] for r in data["requests"]})
    assert seeds[0] == seeds[1] and len(set(seeds[0].values())) == 5  # same request, same seed; each its own
    assert not set(seeds[1].values()) & set(seeds[2].values())  # another repetition samples anew
    bad = _load(server, "--requests", "1", "--temperature", "3")
    assert bad.returncode != 0 and "--temperature must be between 0 and 2" in bad.stderr


def test_raw_prompts_skip_the_chat_template(server: int, tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    res = _load(server, "--requests", "5", "--n-gen", "2", "--warmup", "0", "--raw", out=out)
    assert res.returncode == 0, res.stderr
    data = json.loads(out.read_text())
    assert data["raw_prompts"] is True and data["chat_template"] is None  # not asked
    sent = "".join(map(chr, FakeLlama.completions[-1]["prompt"][1:]))
    assert "<u>" not in sent and sent.strip()  # the question as written, after BOS


def test_load_pads_prompts_to_the_context_length(server: int, tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    res = _load(server, "--requests", "5", "--n-gen", "2", "--warmup", "0", "--context-length", "1500", out=out)
    assert res.returncode == 0, res.stderr
    for r in json.loads(out.read_text())["requests"]:
        assert r["prompt_tokens"] == pytest.approx(1500, rel=0.02)
    # The question stays at the end, after the padding passage.
    assert "".join(map(chr, FakeLlama.completions[-1]["prompt"])).endswith("</u>")


def test_load_refuses_a_context_that_does_not_fit_a_slot(server: int) -> None:
    res = _load(server, "--n-gen", "200", "--context-length", "4000")
    assert res.returncode == 2 and "do not fit a server slot of 4096" in res.stderr


def test_sigterm_stops_the_load_and_keeps_what_was_measured(server: int, tmp_path: Path) -> None:
    FakeLlama.token_s = 0.05  # 200 tokens: 10 s per request
    out = tmp_path / "load.json"
    proc = subprocess.Popen([sys.executable, str(AGENT), "load", "--port", str(server), "--prompts", str(PROMPTS),
                             "--requests", "4", "--n-gen", "200", "--warmup", "0", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.8)
    t = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 3, err
    assert time.monotonic() - t < 3.0
    data = json.loads(out.read_text())
    assert data["interrupted"] is True and data["requests"][0]["error"] == "interrupted"


def test_load_runs_under_python_3_8(server: int, tmp_path: Path) -> None:
    py38 = _python38()
    if py38 is None:
        pytest.skip("no Python 3.8 interpreter here (set EDGEKIT_PYTHON38 to one)")
    res = _load(server, "--concurrency", "2", "--requests", "5", "--n-gen", "3", "--context-length", "600",
                python=py38, out=tmp_path / "l.json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["tokens"] == 15
