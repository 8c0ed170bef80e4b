"""What an engine hands the bench: its servers' configurations, and where on the board the bench works.

Engine-neutral: each engine's bench module (``llamacpp.bench``, ``vllm.bench``, ``litert.bench``) makes
``ServerConfig`` objects from its release (``release.json``), and the bench runs them whatever made them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from edgekit.config.boardfile import Board
from edgekit.remote.runner import LocalRunner, SshRunner


@dataclass
class ServerConfig:
    """One way to run a release's server during a bench."""

    name: str  # "drafter" | "baseline" | a tune point like "n4-p0.5"
    args: list[str]
    speculative: bool
    settings: dict[str, Any] = field(default_factory=dict)
    exe: list[str] | None = None  # the server command before ``args``; None: the release's llama-server
    env: dict[str, str] = field(default_factory=dict)  # the bench unit's environment
    api: str = "llama"  # the dialect the load speaks: llama (llama-server, LiteRT-LM front) | openai (vLLM)
    model: str = ""  # api openai: the served model name
    release_dir: str | None = None  # the release it runs from (None: the deployed one)
    media: list[str] = field(default_factory=list)  # kinds its mmproj takes ("image", "audio"): probed too
    key_file: str = ""  # runtime.auth: key — the board's key file, which the load reads (the server's own args
    env_file: str = ""  # name it, or its unit reads the environment file of it: vLLM)
    draft_counters: list[str] = field(default_factory=list)  # api openai: the /metrics counters the load reads

    def to_json(self) -> dict[str, Any]:
        exe = {"server_command": self.exe} if self.exe else {}
        media = {"media": self.media} if self.media else {}
        return {"name": self.name, "server_args": self.args, "speculative": self.speculative, **exe, **self.settings,
                **media}


@dataclass
class BenchSite:
    """Where a bench runs on the board: what an engine needs to put its own files there (a model bundle
    measured without a release, one exported per tune point)."""

    name: str  # the board's name in the board file
    board: Board
    runner: SshRunner | LocalRunner
    base: str  # the board's edgekit base directory, as probed
    work: str  # the bench's work directory on the board
    agent: str  # the agent's path on the board
    port: int  # the bench port
    say: Callable[[str], None] = lambda _m: None
