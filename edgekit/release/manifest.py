"""`release.json`, typed: what a release is (its files and how it was made) and how its server is checked.

Every reader goes through :meth:`ReleaseManifest.of`, so a field's default lives in one place. Releases written
by earlier edgekit versions lack some fields (engine, gpu, chat, media, candidate_port): they load with the
defaults those versions meant. Fields an engine adds of its own (build, guards, vllm, litert, ...) are kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from edgekit.errors import EdgekitError
from edgekit.release.health import GpuPolicy


class FileEntry(BaseModel):
    model_config = ConfigDict(extra="allow")

    sha256: str
    size: int


class ServeSpec(BaseModel):
    """How a release's server is asked whether it is healthy: its port, whether it must draft, the engine
    whose API answers, the name it serves the model under, the GPU policy, media kinds, chat template."""

    model_config = ConfigDict(frozen=True)

    port: int = 8080
    drafter: bool = False
    engine: str = "llama.cpp"
    model: str = ""
    gpu: GpuPolicy = "none"
    media: tuple[str, ...] = ()
    chat: bool = False
    key_file: str = ""  # the board's API key file, when the server asks for a key (runtime.auth: key)
    draft_counters: tuple[str, ...] = ()  # the /metrics counters its engine names (dialect openai)

    def on_port(self, port: int) -> ServeSpec:
        return self.model_copy(update={"port": port})


class ReleaseManifest(BaseModel):
    model_config = ConfigDict(extra="allow")

    release: str
    recipe: str
    files: dict[str, FileEntry] = Field(default_factory=dict)
    engine: str = "llama.cpp"  # releases before engines were pluggable were all llama.cpp
    port: int = 8080
    candidate_port: int | None = None
    drafter: bool = False
    spec_type: str | None = None
    gpu: GpuPolicy = "none"
    media: list[str] = Field(default_factory=list)
    chat: bool = False
    server_args: list[str] | None = None
    runtime: dict[str, Any] = Field(default_factory=dict)  # the recipe's runtime as served (after any guards)
    # runtime.auth: key — where the board keeps the key and vLLM's environment file of it (paths, never the key)
    api_key_file: str | None = None
    api_env_file: str | None = None
    # dialect openai: the /metrics counters of drafted and accepted tokens (older releases: their engine's)
    draft_counters: list[str] = Field(default_factory=list)
    # The KV cache per token at the served cache types, full and sliding layers apart (edgekit.release.memory
    # kv_fields), where the engine knows it before its server starts (llama.cpp); the bench sizes its context
    # points with it. kv_bytes_per_token: all layers at full length, what older releases recorded.
    kv_layout: dict[str, int] | None = None
    kv_bytes_per_token: int | None = None
    model_context: int | None = None  # the target's trained context: the server gives no slot more

    @property
    def served_host(self) -> str | None:
        """The address its server listens on (the runtime's host, else ``--host`` in its arguments)."""
        if self.runtime.get("host"):
            return str(self.runtime["host"])
        args = self.server_args or []
        return args[args.index("--host") + 1] if "--host" in args[:-1] else None

    @property
    def server_env(self) -> dict[str, str]:
        """The environment the release's units give its server (the recipe's ``runtime.env``)."""
        return {str(k): str(v) for k, v in (self.runtime.get("env") or {}).items()}

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> ReleaseManifest:
        return cls.model_validate(dict(data))

    @classmethod
    def read(cls, data: Mapping[str, Any], where: str) -> ReleaseManifest:
        """:meth:`of` for a release.json read from a board: one sentence when it is missing or damaged."""
        try:
            return cls.of(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"]) or "release.json"
            what = "is missing or unreadable" if not data else f"is damaged ({field}: {first['msg']})"
            raise EdgekitError(f"The release.json of {where} {what}.") from None

    @property
    def serve(self) -> ServeSpec:
        return ServeSpec(port=self.port, drafter=self.drafter, engine=self.engine, model=self.recipe, gpu=self.gpu,
                         media=tuple(self.media), chat=self.chat, key_file=self.api_key_file or "",
                         draft_counters=tuple(self.draft_counters))
