"""A llama-server-compatible HTTP front for LiteRT-LM, so `edgekit bench --backend litert-lm` measures a
``.litertlm`` bundle with the bench's own load, power windows, A/B order and results schema.

Run by the board's LiteRT-LM Python (``litert-lm-api``), not by the agent's python3::

    python litert_server.py --model B.litertlm --port P [--speculative --draft-steps G]

It answers what the load and the health check ask llama-server: ``GET /health``, ``GET /props``,
``POST /tokenize``, ``/detokenize``, ``/apply-template`` (the bundle's chat template, rendered by LiteRT-LM;
404 when it has none: prompts are then sent raw), ``/completion`` (streamed as server-sent events, or one JSON)
and ``/v1/chat/completions`` (a conversation of text messages, greedy unless a request gives a temperature,
streamed as OpenAI's chunks or one JSON, with llama-server's ``timings``), so the OpenAI client talks to it as to
llama-server or vLLM.
One engine serves one request at a time (a lock that every call into it holds, tokenizing included):
concurrent requests queue, which the bench's latency figures then show.

Draft statistics per request: with MTP, LiteRT-LM returns each verify pass's tokens as one streamed
chunk, so ``rounds`` = chunks, ``draft_n`` = rounds × G and ``draft_n_accepted`` = decoded tokens −
rounds (every pass keeps its accepted drafts plus one token of the target). LiteRT-LM's own total
(``MTP Drafter - Success rate``) is logged when the engine closes, at the end of the log, to compare.
"""

from __future__ import annotations

import argparse
import contextlib
import hmac
import importlib.util
import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _keyfile():
    """The agent's keyfile module: from this package when imported as one, else the file beside this one (the
    board runs ``python <release>/agent/litert_server.py``, a script with no package)."""
    if __package__:
        from . import keyfile

        return keyfile
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "keyfile.py")
    spec = importlib.util.spec_from_file_location("_edgekit_keyfile", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read_api_key(path: str) -> str:
    """The key every request but /health must carry, from ``--api-key-file``; SystemExit (78, the reason on
    stderr) when the file is missing, unreadable, empty, short or not printable ASCII: never a front that
    serves without a key because its key file was bad."""
    keyfile = _keyfile()
    try:
        return keyfile.read_key(path)
    except keyfile.KeyFileError as exc:
        print(f"edgekit litert-lm front: refusing to start: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(78) from None


ROLES = ("system", "user", "assistant")


def conversation_of(messages) -> list:
    """An OpenAI ``messages`` list as LiteRT-LM takes it: roles system, user and assistant, text only (a
    content list of text parts is joined), the last message the user's; ValueError saying what is wrong."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages: a non-empty list of {role, content}")
    turns = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise ValueError(f"messages[{i}]: role must be one of {', '.join(ROLES)}")
        content = m.get("content")
        if isinstance(content, list):
            texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
            if len(texts) != len(content) or not all(isinstance(t, str) for t in texts):
                raise ValueError(f"messages[{i}]: text parts only (edgekit's LiteRT-LM bundles are text only)")
            content = "".join(texts)
        if not isinstance(content, str):
            raise ValueError(f"messages[{i}]: content must be text")
        turns.append({"role": m["role"], "content": content})
    if turns[-1]["role"] != "user":
        raise ValueError("the last message must be the user's")
    return turns


class Model:
    def __init__(self, path: str, speculative: bool, draft_steps: int, cache_dir: str, ctx: int,
                 accelerator: str = "cpu", chat_template: str | None = None) -> None:
        import litert_lm

        self.lm = litert_lm
        self.speculative, self.draft_steps, self.ctx = speculative, draft_steps, ctx
        self.chat_template = chat_template  # None: the bundle's own
        litert_lm.set_min_log_severity(litert_lm.LogSeverity.INFO)  # the drafter's success rate, on close
        backend = litert_lm.Backend.GPU() if accelerator == "gpu" else litert_lm.Backend.CPU()
        self.engine = litert_lm.Engine(path, backend=backend, cache_dir=cache_dir,
                                       enable_speculative_decoding=speculative, enable_benchmark=True)
        # Every call into the engine holds it, tokenizing too: one engine is not safe to call from two
        # threads, and a request decoding while another's prompt was detokenized killed the server.
        self.lock = threading.RLock()

    def tokenize(self, text: str, special: bool) -> list:
        with self.lock:
            ids = list(self.engine.tokenize(text))
            bos = self.engine.bos_token_id
        return ([bos] if special and bos is not None else []) + ids

    def detokenize(self, ids: list) -> str:
        with self.lock:
            return self.engine.detokenize([int(i) for i in ids])

    def prompt_text(self, prompt) -> str:
        """llama-server takes text or token ids; a LiteRT-LM session takes text and adds <bos> itself."""
        if isinstance(prompt, list):
            ids = [int(i) for i in prompt]
            with self.lock:
                bos = self.engine.bos_token_id
                while ids and ids[0] == bos:
                    ids = ids[1:]
                return self.detokenize(ids)
        return str(prompt)

    def template(self, messages) -> str | None:
        """The conversation through the chat template (the recipe's, else the bundle's), the model's turn
        opened, as text; None when there is none (LiteRT-LM then renders a message's text unchanged)."""
        turns = conversation_of(messages)
        with self.lock:  # a conversation of its own, only to render: the engine runs one thing at a time
            # Rendering a message renders the conversation's history before it too (and adds nothing to it):
            # the history as the conversation's preface, the last message rendered.
            conversation = self.engine.create_conversation(messages=turns[:-1], chat_template=self.chat_template)
            try:
                rendered = conversation.render_message_to_string(turns[-1])
            finally:
                conversation.close()
        return None if rendered == turns[-1]["content"] else rendered

    def chat(self, body: dict, emit) -> dict:
        """/v1/chat/completions: the templated conversation completed; ``emit(text)`` per streamed
        chunk. The answer carries llama-server's timings, so the health check reads the same fields."""
        turns = conversation_of(body.get("messages"))
        prompt = self.template(turns)
        n_predict = body.get("max_completion_tokens") or body.get("max_tokens") or body.get("n_predict") or 128
        out = self.complete({"prompt": turns[-1]["content"] if prompt is None else prompt, "n_predict": n_predict,
                             "stream": bool(body.get("stream")), "temperature": body.get("temperature"),
                             "seed": body.get("seed")}, emit)
        return {"id": f"chatcmpl-{int(time.time() * 1000)}", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model") or "litert-lm",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": out["content"]},
                             "finish_reason": "length" if out["stop_type"] == "limit" else "stop"}],
                "usage": {"prompt_tokens": out["tokens_evaluated"], "completion_tokens": out["tokens_predicted"],
                          "total_tokens": out["tokens_evaluated"] + out["tokens_predicted"]},
                "timings": out["timings"]}

    def sampler(self, body: dict):
        """Greedy unless the request has a temperature; sampled as llama-server samples by default (top-k 40,
        top-p 0.95), seeded by the request's seed."""
        temperature = float(body.get("temperature") or 0.0)
        if temperature <= 0.0:
            return self.lm.SamplerConfig(top_k=1, temperature=0.0)
        return self.lm.SamplerConfig(top_k=40, top_p=0.95, temperature=temperature, seed=int(body.get("seed") or 0))

    def complete(self, body: dict, emit) -> dict:
        """A completion (greedy unless asked); ``emit(text)`` per streamed chunk; returns llama-server's final
        fields."""
        text = self.prompt_text(body.get("prompt", ""))
        n_predict = int(body.get("n_predict") or 128)
        with self.lock:
            session = self.engine.create_session(apply_prompt_template=False, max_output_tokens=n_predict,
                                                 sampler_config=self.sampler(body))
            try:
                t0 = time.monotonic()
                session.run_prefill([text])
                t1 = time.monotonic()
                rounds, first, parts = 0, None, []
                for resp in session.run_decode_async():
                    chunk = "".join(resp.texts)
                    if not chunk:
                        continue
                    first = first if first is not None else time.monotonic()
                    rounds += 1
                    parts.append(chunk)
                    emit(chunk)
                t2 = time.monotonic()
                info = session.get_benchmark_info()
            finally:
                session.close()
        tokens = int(info.last_decode_token_count) or len(self.tokenize("".join(parts), special=False))
        prompt_n = int(info.last_prefill_token_count)
        timings = {"prompt_n": prompt_n, "prompt_ms": (t1 - t0) * 1000.0, "predicted_n": tokens,
                   "predicted_ms": (t2 - t1) * 1000.0,
                   "predicted_per_second": tokens / (t2 - t1) if t2 > t1 else None}
        if self.speculative:
            drafted = rounds * self.draft_steps
            timings.update(draft_n=drafted, draft_n_accepted=max(0, min(drafted, tokens - rounds)), rounds=rounds)
        return {"content": "" if body.get("stream") else "".join(parts), "stop": True,
                "tokens_predicted": tokens, "tokens_evaluated": prompt_n, "timings": timings,
                "stop_type": "limit" if tokens >= n_predict else "eos"}


def handler_for(model: Model, key: str = ""):
    """``key``: every request but /health must carry ``Authorization: Bearer <key>`` (as llama-server asks)."""
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _refused(self) -> bool:
            given = (self.headers.get("Authorization") or "").partition("Bearer ")[2].strip()
            if not key or self.path == "/health" or hmac.compare_digest(given.encode(), key.encode()):
                return False
            self.close_connection = True  # its body is not read
            self._json(401, {"error": "invalid API key"})
            return True

        def log_message(self, fmt, *args) -> None:  # quiet: the bench reads this log for errors only
            pass

        def _json(self, status: int, data) -> None:
            raw = json.dumps(data).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def _body(self) -> dict:
            n = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(n).decode("utf-8") or "{}") if n else {}

        def do_GET(self) -> None:
            if self._refused():
                return
            if self.path == "/health":
                self._json(200, {"status": "ok"})
            elif self.path == "/props":
                self._json(200, {"default_generation_settings": {"n_ctx": model.ctx}, "backend": "litert-lm",
                                 "speculative": model.speculative, "draft_steps": model.draft_steps})
            else:
                self._json(404, {"error": "not found"})

        def do_POST(self) -> None:
            if self._refused():
                return
            try:
                body = self._body()
            except ValueError:
                self._json(400, {"error": "the body is not JSON"})
                return
            if self.path == "/tokenize":
                self._json(200, {"tokens": model.tokenize(str(body.get("content", "")), bool(body.get("add_special")))})
            elif self.path == "/detokenize":
                self._json(200, {"content": model.detokenize(body.get("tokens") or [])})
            elif self.path == "/completion":
                self._completion(body)
            elif self.path in ("/apply-template", "/v1/chat/completions"):
                self._templated(body)
            else:
                self._json(404, {"error": "not supported by edgekit's LiteRT-LM front"})

        def _templated(self, body: dict) -> None:
            try:
                if self.path == "/apply-template":
                    prompt = model.template(body.get("messages") or [])
                    if prompt is None:  # as llama-server without a template: the load then sends prompts raw
                        self._json(404, {"error": "the bundle has no chat template"})
                    else:
                        self._json(200, {"prompt": prompt})
                elif body.get("stream"):
                    conversation_of(body.get("messages"))  # a bad request is answered 400 before the stream opens
                    self._chat_stream(body)
                else:
                    self._json(200, model.chat(body, lambda _c: None))
            except ValueError as exc:
                self._json(400, {"error": str(exc)})
            except Exception as exc:  # the client sees why, the server keeps serving
                self._json(500, {"error": str(exc)})

        def _chat_stream(self, body: dict) -> None:
            """OpenAI's chat.completion.chunk events, as llama-server and vLLM send them, then ``[DONE]``."""
            head = {"id": f"chatcmpl-{int(time.time() * 1000)}", "object": "chat.completion.chunk",
                    "created": int(time.time()), "model": body.get("model") or "litert-lm"}
            self._open_stream()
            try:
                self._event({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                  "finish_reason": None}]})
                out = model.chat(body, lambda chunk: self._event(
                    {**head, "choices": [{"index": 0, "delta": {"content": chunk}, "finish_reason": None}]}))
                finish = out["choices"][0]["finish_reason"]
                last = {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}],
                        "timings": out["timings"]}
                if (body.get("stream_options") or {}).get("include_usage"):
                    last["usage"] = out["usage"]
                self._event(last)
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                pass
            except Exception as exc:  # the stream is open: the error goes as its last event
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self._event({"error": {"message": str(exc), "type": "server_error"}})
            self.close_connection = True

        def _open_stream(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()

        def _event(self, data: dict) -> None:
            self.wfile.write(b"data: " + json.dumps(data).encode() + b"\n\n")
            self.wfile.flush()

        def _completion(self, body: dict) -> None:
            if not body.get("stream"):
                try:
                    self._json(200, model.complete(body, lambda _c: None))
                except Exception as exc:  # the client sees why, the server keeps serving
                    self._json(500, {"error": str(exc)})
                return
            self._open_stream()
            try:
                final = model.complete(body, lambda chunk: self._event({"content": chunk, "stop": False}))
            except (BrokenPipeError, ConnectionResetError):
                return
            except Exception as exc:
                final = {"error": str(exc)}
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self._event(final)
            self.close_connection = True

    return Handler


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--speculative", action="store_true", help="run the bundle's MTP drafter")
    p.add_argument("--draft-steps", type=int, default=0, help="G: tokens drafted per verify pass")
    p.add_argument("--ctx", type=int, default=4096, help="the bundle's KV cache length (reported in /props)")
    p.add_argument("--cache-dir", default="/tmp/edgekit-litert-cache")
    p.add_argument("--accelerator", choices=("cpu", "gpu"), default="cpu", help="LiteRT-LM's backend")
    p.add_argument("--api-key-file", default="", help="the file holding the key every request but /health needs")
    p.add_argument("--chat-template-file", default="", help="a Jinja chat template that replaces the bundle's")
    args = p.parse_args(argv)
    key = read_api_key(args.api_key_file) if args.api_key_file else ""  # before the engine loads or a port opens
    os.makedirs(args.cache_dir, exist_ok=True)  # LiteRT-LM refuses a cache dir that does not exist
    template = None
    if args.chat_template_file:
        with open(args.chat_template_file, encoding="utf-8") as f:
            template = f.read()
    model = Model(args.model, args.speculative, args.draft_steps, args.cache_dir, args.ctx, args.accelerator, template)
    server = ThreadingHTTPServer((args.host, args.port), handler_for(model, key))
    server.daemon_threads = True
    # systemd stops with SIGTERM: close the engine so LiteRT-LM logs the drafter's success rate.
    signal.signal(signal.SIGTERM, lambda *_a: threading.Thread(target=server.shutdown, daemon=True).start())
    print(f"edgekit litert-lm front on {args.host}:{args.port} (speculative={args.speculative})", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
        with model.lock:  # a request still decoding finishes first: closing under it would break the heap
            model.engine.close()
        sys.stderr.flush()


if __name__ == "__main__":
    main()
