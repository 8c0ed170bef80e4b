"""`load`: a closed-loop load against llama-server (or vLLM's OpenAI server), run on the board itself.

    load --port P --prompts FILE --concurrency C --requests N --n-gen G [--context-length L]
         [--warmup K] [--offset O] [--ignore-eos] [--raw] [--out FILE]
         [--api openai --model NAME [--draft-counters DRAFTED,ACCEPTED]]

``--api openai`` speaks vLLM's dialect: ``/tokenize``, ``/detokenize``, the chat template through
``/tokenize`` with messages, streaming ``/v1/completions`` with the usage chunk; such a server reports no
draft counts per request, so the run's come from the ``/metrics`` counters its engine names
(``--draft-counters``, the release's ``draft_counters``) read just before and just after the measured requests.

C worker threads send N streaming ``/completion`` requests (``"stream": true``) from the prompt
set, category after category, so every run covers every category. Per request: TTFT (first
token streamed), latency, prompt and generated tokens, and ``timings.draft_n`` /
``draft_n_accepted``. The measured window is board-monotonic time from the first request sent to
the last answer, after K warm-up rounds of C requests; the host integrates power over exactly it.

Prompts are built on the server's own tokenizer: the chat template (``/apply-template``) when the
model has one (``--raw``: never), and for ``--context-length L`` a passage of the prompt set's context text put
before the question until the prompt is about L tokens; they are sent as token ids, so both
server configurations see exactly the same prompt.

SIGTERM / SIGINT stop the load: in-flight requests are cut, the file is written with
``"interrupted": true``, exit 3. Standard library only (Python 3.8).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import re
import signal
import socket
import threading
import time
from typing import Any, Callable, Sequence

from .health import read_counters, read_key

_FINAL = re.compile(rb'"stop":\s*true|"error"')  # the last chunk (or an error): only these are parsed


class LoadError(ValueError):
    """Printed by the agent's main as one sentence, exit 2."""


class Server:
    """llama-server on this board (127.0.0.1 by default)."""

    def __init__(self, host: str, port: int, timeout: float, key_file: str = "") -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self.headers = {"Content-Type": "application/json"}
        if key_file:  # runtime.auth: key: the key is read from its file, never passed in argv
            self.headers["Authorization"] = f"Bearer {read_key(key_file)}"

    def connect(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)

    def call(self, method: str, path: str, payload: Any = None) -> tuple[int, Any]:
        conn = self.connect()
        try:
            body = json.dumps(payload).encode() if payload is not None else None
            conn.request(method, path, body=body, headers=self.headers)
            resp = conn.getresponse()
            raw = resp.read()
        except OSError as exc:
            raise LoadError(f"llama-server on port {self.port} does not answer {path} ({exc})") from None
        finally:
            conn.close()
        try:
            return resp.status, json.loads(raw.decode("utf-8") or "null")
        except ValueError:
            return resp.status, None

    def tokenize(self, text: str, special: bool) -> list[int]:
        status, data = self.call("POST", "/tokenize", {"content": text, "add_special": special})
        if status != 200 or not isinstance(data, dict):
            raise LoadError(f"llama-server's /tokenize answered {status}")
        return [t if isinstance(t, int) else t["id"] for t in data.get("tokens", [])]

    def detokenize(self, tokens: list[int]) -> str:
        status, data = self.call("POST", "/detokenize", {"tokens": tokens})
        if status != 200 or not isinstance(data, dict):
            raise LoadError(f"llama-server's /detokenize answered {status}")
        return str(data.get("content", ""))

    def template(self, content: str) -> str | None:
        """The chat-formatted prompt, or None when the server has no usable template."""
        status, data = self.call("POST", "/apply-template", {"messages": [{"role": "user", "content": content}]})
        if status == 200 and isinstance(data, dict) and isinstance(data.get("prompt"), str):
            return data["prompt"]
        return None

    def slot_ctx(self) -> int | None:
        status, data = self.call("GET", "/props")
        if status != 200 or not isinstance(data, dict):
            return None
        n_ctx = (data.get("default_generation_settings") or {}).get("n_ctx")
        return int(n_ctx) if n_ctx else None


class OpenAIServer(Server):
    """vLLM's OpenAI server on this board: the same questions, asked its way."""

    api = "openai"

    def __init__(self, host: str, port: int, timeout: float, model: str, key_file: str = "",
                 counters: Sequence[str] = ()) -> None:
        super().__init__(host, port, timeout, key_file)
        self.model, self.counters = model, counters

    def tokenize(self, text: str, special: bool) -> list[int]:
        status, data = self.call("POST", "/tokenize", {"model": self.model, "prompt": text,
                                                       "add_special_tokens": special})
        if status != 200 or not isinstance(data, dict):
            raise LoadError(f"vLLM's /tokenize answered {status}")
        return [int(t) for t in data.get("tokens", [])]

    def detokenize(self, tokens: list[int]) -> str:
        status, data = self.call("POST", "/detokenize", {"model": self.model, "tokens": tokens})
        if status != 200 or not isinstance(data, dict):
            raise LoadError(f"vLLM's /detokenize answered {status}")
        return str(data.get("prompt", ""))

    def template(self, content: str) -> str | None:
        status, data = self.call("POST", "/tokenize", {"model": self.model, "add_generation_prompt": True,
                                                       "messages": [{"role": "user", "content": content}]})
        if status != 200 or not isinstance(data, dict) or not data.get("tokens"):
            return None  # no chat template: raw prompts
        return self.detokenize([int(t) for t in data["tokens"]])

    def slot_ctx(self) -> int | None:
        status, data = self.call("GET", "/v1/models")
        models = (data or {}).get("data") if isinstance(data, dict) else None
        if status != 200 or not models:
            return None
        n_ctx = models[0].get("max_model_len")
        return int(n_ctx) if n_ctx else None

    def spec_counters(self) -> dict[str, int]:
        conn = self.connect()
        try:
            conn.request("GET", "/metrics", headers=self.headers)
            text = conn.getresponse().read().decode("utf-8", "replace")
        except OSError as exc:
            raise LoadError(f"vLLM on port {self.port} does not answer /metrics ({exc})") from None
        finally:
            conn.close()
        got = read_counters(text, self.counters)
        return {"draft_n": int(got.get("draft", 0)), "draft_n_accepted": int(got.get("accepted", 0))}



def load_prompts(path: str) -> tuple[list[str], dict[str, list[str]], str]:
    """(category order, prompts per category, context text) of a prompt-set file."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError) as exc:
        raise LoadError(f"cannot read the prompt set {path} ({exc})") from None
    cats = data.get("categories") or {}
    order = [c for c in cats if cats[c]]
    if not order:
        raise LoadError(f"the prompt set {path} has no prompts")
    return order, {c: [str(p) for p in cats[c]] for c in order}, str(data.get("context") or "")


class PromptBuilder:
    """Token ids for a question at a target context length, on the server's tokenizer."""

    def __init__(self, server: Server, context_text: str, raw: bool = False) -> None:
        self.server = server
        self.context_text = context_text
        self.raw = raw  # --raw: the question as written, even where the model has a chat template
        self.has_template: bool | None = None
        self._ctx_tokens: list[int] | None = None
        self._prefix: list[int] | None = None

    def _wrap(self, content: str) -> str:
        if self.has_template is not False and not self.raw:
            templated = self.server.template(content)
            self.has_template = templated is not None
            if templated is not None:
                return templated
        return content

    def _encode(self, content: str) -> list[int]:
        tokens = self.server.tokenize(self._wrap(content), special=True)
        if self._prefix is None:
            self._prefix = self.server.tokenize("", special=True)  # the model's BOS, if it adds one
        k = len(self._prefix)
        if k and tokens[:2 * k] == self._prefix * 2:
            tokens = tokens[k:]  # a template that writes <bos> itself, plus the tokenizer's: keep one
        return tokens

    def _context(self, n: int) -> list[int]:
        if self._ctx_tokens is None:
            self._ctx_tokens = self.server.tokenize(self.context_text, special=False) if self.context_text else []
        if not self._ctx_tokens:
            raise LoadError("the prompt set has no context text to reach a longer context length")
        reps = n // len(self._ctx_tokens) + 1
        return (self._ctx_tokens * reps)[:n]

    def build(self, question: str, length: int | None) -> list[int]:
        tokens = self._encode(question)
        if not length or len(tokens) >= length:
            return tokens
        want = length - len(tokens)
        for _ in range(4):  # detokenize → retokenize is not exact at the seam: converge in a few steps
            passage = self.server.detokenize(self._context(want)) if want > 0 else ""
            tokens = self._encode(passage.rstrip() + "\n\n" + question if passage else question)
            diff = len(tokens) - length
            if abs(diff) <= max(2, length // 100):
                break
            want = max(want - diff, 0)
        return tokens


class Request:
    def __init__(self, index: int, category: str, prompt_index: int, tokens: list[int]) -> None:
        self.index, self.category, self.prompt_index, self.tokens = index, category, prompt_index, tokens
        self.record: dict[str, Any] = {}


class Load:
    def __init__(self, server: Server, n_gen: int, ignore_eos: bool, temperature: float = 0.0,
                 seed_base: int = 0) -> None:
        self.server, self.n_gen, self.ignore_eos = server, n_gen, ignore_eos
        self.temperature, self.seed_base = temperature, seed_base
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._open: set[http.client.HTTPConnection] = set()

    def abort(self) -> None:
        """Stop sending and cut the requests in flight (llama-server cancels a closed stream)."""
        self.stop.set()
        with self._lock:
            conns = list(self._open)
        for conn in conns:
            sock = conn.sock
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def one(self, req: Request) -> dict[str, Any]:
        rec: dict[str, Any] = {"i": req.index, "category": req.category, "prompt_index": req.prompt_index,
                               "prompt_tokens": len(req.tokens)}
        openai = isinstance(self.server, OpenAIServer)
        # Sampled: each request its own seed, the same for the same request of every configuration (a fair pair).
        seed = self.seed_base + req.index if self.temperature else 0
        if self.temperature:
            rec["seed"] = seed
        if isinstance(self.server, OpenAIServer):
            payload = {"model": self.server.model, "prompt": req.tokens, "max_tokens": self.n_gen, "stream": True,
                       "stream_options": {"include_usage": True}, "temperature": self.temperature, "seed": seed,
                       "ignore_eos": self.ignore_eos}
            final = self._stream("/v1/completions", payload, rec, self._read_openai)
        else:
            payload = {"prompt": req.tokens, "n_predict": self.n_gen, "stream": True, "temperature": self.temperature,
                       "cache_prompt": False, "seed": seed, "ignore_eos": self.ignore_eos}
            final = self._stream("/completion", payload, rec, self._read_llama)
        if "error" in rec:
            return rec
        if final is not None and "error" in final:
            rec["error"] = str(final["error"])[:300]
        elif final is not None and openai:
            usage = final["usage"]
            rec.update(tokens=int(usage.get("completion_tokens") or 0),
                       prompt_tokens=int(usage.get("prompt_tokens") or rec["prompt_tokens"]))
        elif final is not None:
            tm = final.get("timings") or {}
            rec.update(tokens=int(tm.get("predicted_n") or final.get("tokens_predicted") or 0),
                       prompt_tokens=int(tm.get("prompt_n") or rec["prompt_tokens"]),
                       decode_tps=tm.get("predicted_per_second"), prompt_ms=tm.get("prompt_ms"),
                       predicted_ms=tm.get("predicted_ms"), draft_n=tm.get("draft_n"),
                       draft_n_accepted=tm.get("draft_n_accepted"), stop_type=final.get("stop_type"))
        else:
            rec["error"] = "interrupted" if self.stop.is_set() else "the stream ended without a final chunk"
        return rec

    def _stream(self, path: str, payload: dict[str, Any], rec: dict[str, Any],
                read: Callable[[Any], tuple[float | None, dict[str, Any] | None]]) -> dict[str, Any] | None:
        """POST one streaming request; times it into ``rec``; returns the final chunk ``read`` found."""
        conn = self.server.connect()
        with self._lock:
            self._open.add(conn)
        t0 = time.monotonic()
        rec["start"] = round(t0, 6)
        first = final = None
        try:
            conn.request("POST", path, body=json.dumps(payload).encode(), headers=self.server.headers)
            resp = conn.getresponse()
            if resp.status != 200:
                rec["error"] = f"HTTP {resp.status}: {resp.read()[:200].decode('utf-8', 'replace')}"
            else:
                first, final = read(resp)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            # A stop shuts the socket down under the reader, which then sees a reset: that is ours.
            rec["error"] = "interrupted" if self.stop.is_set() else f"{type(exc).__name__}: {exc}"
        finally:
            with self._lock:
                self._open.discard(conn)
            conn.close()
        t1 = time.monotonic()
        rec.update(end=round(t1, 6), latency_s=round(t1 - t0, 6),
                   ttft_s=round(first - t0, 6) if first is not None else None)
        return final

    def _read_llama(self, resp: Any) -> tuple[float | None, dict[str, Any] | None]:
        first = None
        while not self.stop.is_set():
            line = resp.readline()
            if not line:
                break
            if not line.startswith(b"data: "):
                continue
            if first is None:
                first = time.monotonic()  # the first streamed chunk carries the first token
            if _FINAL.search(line):  # parse only what may be the end: cheap per streamed token
                chunk = json.loads(line[6:].decode("utf-8"))
                if chunk.get("stop") or "error" in chunk:  # not a token whose text is "error"
                    return first, chunk
        return first, None

    def _read_openai(self, resp: Any) -> tuple[float | None, dict[str, Any] | None]:
        """vLLM's stream: a chunk per step, then one with the usage (stream_options), then [DONE]."""
        first = final = None
        while not self.stop.is_set():
            line = resp.readline()
            if not line or line.startswith(b"data: [DONE]"):
                break
            if not line.startswith(b"data: "):
                continue
            chunk = json.loads(line[6:].decode("utf-8"))
            if "error" in chunk:
                return first, chunk
            if first is None and chunk.get("choices"):
                first = time.monotonic()  # the first chunk with a choice carries the first token
            if chunk.get("usage"):
                final = chunk
        return first, final

    def run(self, requests: list[Request], concurrency: int) -> tuple[float, float]:
        """Closed loop: C workers take the next request as soon as theirs is answered."""
        queue = list(requests)
        qlock = threading.Lock()
        ready = threading.Barrier(concurrency + 1)

        def worker() -> None:
            ready.wait()
            while not self.stop.is_set():
                with qlock:
                    if not queue:
                        return
                    req = queue.pop(0)
                req.record = self.one(req)

        threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
        for th in threads:
            th.start()
        ready.wait()
        t0 = time.monotonic()
        for th in threads:
            while th.is_alive():
                th.join(0.2)  # short joins: the main thread must stay free for signal handlers
        return t0, time.monotonic()


SEEDS_PER_OFFSET = 1_000_000  # request i of offset k is seeded k·10⁶ + i: no two requests of a bench share one


def plan(order: list[str], prompts: dict[str, list[str]], n: int, offset: int) -> list[tuple[str, int]]:
    """(category, prompt index) of request i: categories in turn, prompts within one in turn."""
    out = []
    for i in range(n):
        k = i + offset
        cat = order[k % len(order)]
        out.append((cat, (k // len(order)) % len(prompts[cat])))
    return out


def cmd_load(args: argparse.Namespace) -> int:
    if args.concurrency < 1 or args.requests < 1 or args.n_gen < 1 or args.warmup < 0:
        raise LoadError("--concurrency, --requests and --n-gen must be at least 1, --warmup at least 0")
    if not 0.0 <= args.temperature <= 2.0:
        raise LoadError(f"--temperature must be between 0 and 2, not {args.temperature:g}")
    if args.api == "openai" and not args.model:
        raise LoadError("--api openai needs --model (the name the server serves the model under)")
    try:
        server = (OpenAIServer(args.host, args.port, args.timeout, args.model, args.api_key_file, args.draft_counters)
                  if args.api == "openai" else Server(args.host, args.port, args.timeout, args.api_key_file))
    except OSError as exc:
        raise LoadError(f"cannot read the API key file {args.api_key_file}: {exc.strerror}") from None
    order, prompts, context = load_prompts(args.prompts)
    n_ctx = server.slot_ctx()
    if n_ctx and args.context_length and args.context_length + args.n_gen > n_ctx:
        raise LoadError(f"context length {args.context_length} + {args.n_gen} generated tokens do not fit a "
                        f"server slot of {n_ctx} tokens")
    builder = PromptBuilder(server, context, args.raw)
    cache: dict[tuple[str, int], list[int]] = {}

    def requests(n: int, offset: int) -> list[Request]:
        out = []
        for i, (cat, k) in enumerate(plan(order, prompts, n, offset)):
            if (cat, k) not in cache:
                cache[(cat, k)] = builder.build(prompts[cat][k], args.context_length)
            out.append(Request(i, cat, k, cache[(cat, k)]))
        return out

    measured = requests(args.requests, args.offset)
    warm = requests(args.warmup * args.concurrency, args.offset + 1)
    load = Load(server, args.n_gen, args.ignore_eos, args.temperature, SEEDS_PER_OFFSET * args.offset)
    old = {s: signal.signal(s, lambda _n, _f: load.abort()) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        w0 = time.monotonic()
        if warm:
            load.run(warm, args.concurrency)
        w1 = time.monotonic()
        # vLLM counts drafts per server, not per request: the measured requests' share is the difference.
        before = server.spec_counters() if isinstance(server, OpenAIServer) else None
        t0, t1 = load.run(measured, args.concurrency) if not load.stop.is_set() else (w1, w1)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    recs = [r.record for r in measured if r.record]
    if recs:  # the window is exactly first request sent → last answer received
        t0, t1 = min(r["start"] for r in recs), max(r["end"] for r in recs)
    tokens = sum(r.get("tokens", 0) for r in recs if "error" not in r)
    result = {
        "port": args.port, "concurrency": args.concurrency, "context_length": args.context_length,
        "n_gen": args.n_gen, "ignore_eos": args.ignore_eos, "offset": args.offset, "label": args.label,
        "temperature": args.temperature,
        "chat_template": builder.has_template, "raw_prompts": args.raw, "slot_ctx": n_ctx,
        "warmup": {"requests": len(warm), "start": round(w0, 6), "end": round(w1, 6),
                   "errors": sum(1 for r in warm if "error" in r.record)},
        "window": {"start": round(t0, 6), "end": round(t1, 6), "duration_s": round(t1 - t0, 6)},
        "requests": recs, "tokens": tokens, "errors": sum(1 for r in recs if "error" in r),
        "tokens_per_second": round(tokens / (t1 - t0), 4) if t1 > t0 else None,
        "interrupted": load.stop.is_set(), "api": args.api,
    }
    if before is not None:
        after = server.spec_counters()  # type: ignore[attr-defined]
        result["spec_decode"] = {k: after[k] - before[k] for k in before}
    text = json.dumps(result)
    if args.out:
        tmp = args.out + ".part"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
        os.replace(tmp, args.out)  # the host never reads half a file
    summary = {k: result[k] for k in ("concurrency", "context_length", "tokens", "errors", "tokens_per_second",
                                       "interrupted")}
    print(json.dumps(summary if args.out else result), flush=True)
    return 3 if load.stop.is_set() else 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("load", help="streaming load against llama-server on this board (TTFT, tokens, drafts)")
    p.add_argument("--port", type=int, required=True, help="llama-server's port on this board")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--prompts", required=True, help="prompt-set JSON file ({categories: {name: [...]}, context})")
    p.add_argument("--concurrency", type=int, default=1, help="requests in flight at once")
    p.add_argument("--requests", type=int, default=5, help="measured requests")
    p.add_argument("--n-gen", type=int, default=128, help="tokens to generate per request")
    p.add_argument("--context-length", type=int, default=None, help="prompt length in tokens (about)")
    p.add_argument("--warmup", type=int, default=1, help="warm-up rounds of --concurrency requests, not measured")
    p.add_argument("--offset", type=int, default=0, help="rotate the prompts (e.g. the repetition number)")
    p.add_argument("--ignore-eos", action="store_true", help="always generate --n-gen tokens")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="sampling temperature (0: greedy); a sampled request's seed is its number + offset × 10⁶")
    p.add_argument("--raw", action="store_true", help="send the prompts as written, without the chat template")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    p.add_argument("--label", default=None, help="copied into the output")
    p.add_argument("--out", default=None, help="write the full result here (stdout gets a summary)")
    p.add_argument("--api", choices=("llama", "openai"), default="llama",
                   help="the server's dialect: llama-server's, or vLLM's OpenAI API")
    p.add_argument("--model", default=None, help="--api openai: the served model name")
    p.add_argument("--draft-counters", type=lambda s: [n for n in s.split(",") if n], default=[],
                   help="--api openai: the /metrics counters of drafted and accepted tokens, comma-separated")
    p.add_argument("--api-key-file", default="", help="the file holding the server's API key (runtime.auth: key)")
    p.set_defaults(fn=cmd_load)
