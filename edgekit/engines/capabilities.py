"""What an engine can do, declared on its class (the shape of vLLM's model registry: the table names the
class, the class says what it supports). bench, tune, report, plots and fleet ask the engine's class and
branch on no engine name.

``EngineBase`` holds the defaults: an engine that drafts by server flags, one request shape, no model of its
own to bench without a release, its releases made board by board for a fleet. An engine overrides what
differs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from pydantic import BaseModel

from edgekit.errors import EdgekitError

if TYPE_CHECKING:
    from rich.console import Console

    from edgekit.config.boardfile import Board
    from edgekit.config.recipes import Recipe, Runtime
    from edgekit.engines.base import EngineRelease, ReleaseContext
    from edgekit.engines.benchconf import BenchSite, ServerConfig
    from edgekit.models.footprint import KvBytes, KvLayout
    from edgekit.release.plan import ReleasePlan
    from edgekit.remote.probe import BoardFacts
    from edgekit.remote.runner import LocalRunner, SshRunner

M = TypeVar("M", bound=BaseModel)


class FleetBoard(Protocol):
    """A board of a fleet run, probed and connected (``fleet.connect.Target``)."""

    board: Board
    facts: BoardFacts
    runner: SshRunner | LocalRunner


@dataclass
class FleetReleases:
    plans: dict[str, ReleasePlan] = field(default_factory=dict)  # board name → its release
    builds: dict[str, str] = field(default_factory=dict)  # what was built once for several boards → artifact key


def read_section(model: type[M], section: str, runtime: Runtime | Mapping[str, Any]) -> M:
    """``runtime.<section>`` validated by ``model``. A release.json written before its engine had a section
    keeps those settings at the top of its ``runtime``: they are read from there."""
    if not isinstance(runtime, Mapping):
        return model.model_validate(runtime.section(section))
    found = runtime.get(section)
    if not isinstance(found, Mapping):
        found = {k: runtime[k] for k in model.model_fields if k in runtime}
    return model.model_validate(dict(found))


@dataclass(frozen=True)
class EngineOption:
    """An option of the bench command that belongs to one engine (``--litert-python``): declared on its class,
    collected by ``edgekit bench`` when it runs, handed back to that engine alone (``options[key]``)."""

    key: str  # what the engine reads: options[key]
    flag: str  # the command line's spelling, e.g. --litert-python
    help: str
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    default: str | int | None = None
    type: type = str  # str or int


class EngineBase:
    name: ClassVar[str]
    # the HTTP dialect its server's health completion speaks: "llama" | "openai" (see base.Engine)
    health_api: ClassVar[str]
    # the runtime.spec_type values it serves (checked as a recipe is loaded, edgekit.engines.recipe_check)
    spec_types: ClassVar[tuple[str, ...]] = ("none", "draft-mtp")
    # dialect "openai": the /metrics counters of drafted and accepted tokens its server keeps (its completions
    # carry no draft counts); its releases record them (release.json's draft_counters) for the board's checks
    draft_counters: ClassVar[tuple[str, str] | None] = None
    color: ClassVar[str] = "#7f7f7f"  # its line in the bench's plots when several engines are measured
    # what a request's body adds to be served without drafting, on a server that drafts (None: it cannot)
    draft_off_request: ClassVar[dict[str, Any] | None] = None
    # the p-min values `tune` sweeps when none are given (None: the server's own default); one None: it has none
    tune_p_mins: ClassVar[tuple[float | None, ...]] = (None,)
    # its draft length is fixed when its model is exported: `tune` exports one model per length
    # (``tune_drafters``) instead of changing server flags (``tune_point``)
    tunes_by_export: ClassVar[bool] = False
    # its release ships a benchmark of the target alone (``target_bench_argv``: llama-bench) and a GGUF target
    # at this path: the bench runs that benchmark's pp / tg and draws the GGUF's roofline (None: neither)
    target_gguf: ClassVar[str | None] = None
    # `bench --backend <name>`: the recipe's model measured through the engine without a release
    # (``bench_model``, ``model_configs``, ``model_record``, ``report_what``)
    benches_model: ClassVar[bool] = False
    # With runtime.auth: key, the paths its server answers without the key besides /health (None: it cannot
    # serve a network address at all: its key leaves paths open that serve the model).
    open_without_key: ClassVar[tuple[str, ...] | None] = ()
    # a GET its server answers only with the key: `board key rotate` checks the new key and the old one on it
    key_probe_path: ClassVar[str] = "/props"
    # the environment variable its server reads the key from (its unit's environment file, <base>/keys/<NAME>.env,
    # release/auth.py); None: it is given the key file's path (<base>/keys/api.key)
    key_env: ClassVar[str | None] = None
    # what it makes of the recipe's models on the host (none: the checkpoints as they are): the built-in formats
    # (prepare.pipeline.FORMATS) and its own, each made by its converter step (format → prepare.pipeline.Converter),
    # in this order, so a step of its own can take what a built-in one made
    model_formats: ClassVar[tuple[str, ...]] = ()
    converters: ClassVar[Mapping[str, Callable[..., None]]] = {}
    # its own section of a recipe's runtime (``runtime.<settings_section>:``) and the model that validates it
    # (edgekit.engines.recipe_check); None: it has no settings of its own
    settings_section: ClassVar[str | None] = None
    Settings: ClassVar[type[BaseModel] | None] = None
    # groups its server's user needs on a board, each with a note `board setup` gives where the user lacks it
    # (a sentence with {user}: what for, and what to do where that group is too much)
    board_groups: ClassVar[tuple[tuple[str, str], ...]] = ()
    # what it needs of a board (the board file's ``boards.<name>.<settings_section>:``), validated by this model
    # (edgekit.engines.board_check); None: nothing
    BoardSettings: ClassVar[type[BaseModel] | None] = None
    # its options of `edgekit bench` (edgekit.cli.engine_options collects them; ``options`` below holds their values)
    bench_options: ClassVar[tuple[EngineOption, ...]] = ()

    def settings(self, runtime: Runtime | Mapping[str, Any]) -> Any:
        """Its section of a recipe's runtime, or of a release.json's ``runtime`` (one written before the engine
        had a section keeps those settings at the top: they are read from there), validated, defaults filled."""
        if self.Settings is None or self.settings_section is None:
            raise EdgekitError(f"Engine {self.name} has no settings of its own.")
        return read_section(self.Settings, self.settings_section, runtime)

    def release(self, ctx: ReleaseContext) -> EngineRelease:
        raise NotImplementedError

    def kv_cache_bytes(self, plan: ReleasePlan, recipe: Recipe) -> int:
        """The KV cache its server allocates for ``plan`` at the recipe's context (0: not known up front)."""
        return 0

    def compute_buffer_bytes(self, plan: ReleasePlan, recipe: Recipe) -> int:
        """The compute buffers its server allocates for ``plan`` at the recipe's context, beside weights and cache
        (0: counted in the runtime allowance)."""
        return 0

    def served_quant(self, quant: str, runtime: Runtime) -> str:
        """The form a model of the recipe's ``quant`` is held in memory by this engine's server (a key of
        edgekit.models.footprint.BYTES_PER_WEIGHT): the converted quantization, unless the engine serves the
        checkpoint itself."""
        return quant

    def kv_bytes_of(self, layout: KvLayout, runtime: Runtime) -> KvBytes | None:
        """The cache per token its server keeps for models of ``layout`` at the runtime's cache types, before
        they are converted (edgekit.engines.recipe_fit); None: the engine cannot say up front."""
        return None

    def compute_bytes_of(self, models: Sequence[tuple[int, int]], runtime: Runtime, profile: str | None,
                         ctx: int) -> int:
        """The scratch its server allocates beside weights and cache at ``ctx`` tokens for ``models`` (each its
        attention heads and vocabulary: the target's, the drafter's) on a board of ``profile`` (None: the recipe's
        settings as written); 0: counted in the runtime allowance (edgekit.release.memory)."""
        return 0

    def check_host_needs(self, recipe: Recipe) -> None:
        """Refuse, before anything is built or sent, a recipe whose models need a package this Python lacks."""
        from edgekit.prepare.needs import check

        check(recipe, self.model_formats, serve=True)

    def check_exposure(self, host: str, loopback: bool) -> None:
        """Refuse, before anything is built or sent, a network address this engine's key cannot guard."""
        if not loopback and self.open_without_key is None:
            raise EdgekitError(
                f"{self.name} cannot serve on {host} with a key: its key guards only some of the paths that "
                "serve the model; serve it on the board's loopback (127.0.0.1) and reach it through SSH.")

    def served_runtime(self, runtime: Runtime) -> dict[str, Any]:
        """The runtime as a release records it (release.json's ``runtime``, part of its id): its own section
        completed with its defaults, whether or not the recipe was loaded through edgekit.engines.recipe_check."""
        out = runtime.model_dump(mode="json")
        if self.Settings is not None and self.settings_section is not None:
            out[self.settings_section] = self.settings(runtime).model_dump(mode="json")
        return out

    def board_settings(self, board: Board) -> Any:
        """Its section of a board of the board file, validated, defaults filled."""
        if self.BoardSettings is None or self.settings_section is None:
            raise EdgekitError(f"Engine {self.name} has no board settings of its own.")
        return self.BoardSettings.model_validate(board.section(self.settings_section))

    # --- bench and tune -------------------------------------------------------------------------------------

    def bench_configs(self, manifest: dict[str, Any], release_dir: str, board: Board, port: int,
                      parallel: int | None, slot_ctx: int | None, options: Mapping[str, Any]) -> list[ServerConfig]:
        """[drafter, baseline] of a release (``release.json``: ``manifest``) moved to the bench port with
        ``parallel`` slots of ``slot_ctx`` tokens (only the baseline when it does not draft); ``options``: the
        values of its ``bench_options`` the bench was given."""
        raise NotImplementedError

    def check_bench_fits(self, manifest: dict[str, Any], release_id: str, fits: Callable[[int], bool]) -> None:
        """Refuse, in one sentence, a release whose fixed context cannot hold the bench's longest request."""

    def tune_point(self, drafter: ServerConfig, n: int, p_min: float | None) -> ServerConfig:
        """The drafter configuration with draft length ``n`` (and p-min) in this engine's spelling."""
        raise EdgekitError(f"{self.name}'s draft length is fixed when its model is exported: tune sweeps it "
                           "with one model per length (tune_drafters), not by server flags.")

    # the KV cache types `tune --kv-types` may sweep (none: it cannot)
    kv_cache_types: ClassVar[tuple[str, ...]] = ()

    def tune_kv_cache(self, cfg: ServerConfig, kind: str) -> ServerConfig:
        """``cfg`` with its KV cache at ``kind`` (one of ``kv_cache_types``), in this engine's spelling."""
        raise EdgekitError(f"{self.name} has no KV cache types to tune.")

    def runtime_with_kv_cache(self, runtime: Runtime, k: str, v: str) -> Runtime:
        """The recipe's runtime serving with the KV cache tune chose (K and V types)."""
        raise EdgekitError(f"{self.name} has no KV cache types to tune.")

    def tune_drafters(self, site: BenchSite, manifest: dict[str, Any], recipe: Recipe, draft_n: list[int],
                      p_mins: list[float | None] | None, parallel: list[int] | None) -> list[ServerConfig]:
        """``tunes_by_export``: one drafter configuration per draft length, each with its own exported model."""
        raise EdgekitError(f"{self.name} is tuned by server flags (tune_point), not by exports.")

    def target_bench_argv(self, release_dir: str, runtime: dict[str, Any], pp: int, tg: int,
                          reps: int) -> list[str]:
        """``target_gguf``: the benchmark of the release's target alone, one test (pp: pp prompt tokens,
        tg: tg generated tokens) with the settings the release serves with (``runtime``)."""
        raise EdgekitError(f"{self.name} has no benchmark of its target alone.")

    def target_bench_records(self, lines: list[str]) -> list[dict[str, Any]]:
        """``target_gguf``: that benchmark's records from its output, as the results document keeps them
        (``llama_bench``: test, avg_ts, …)."""
        return []

    def bench_model(self, recipe: Recipe, fits: Callable[[int], bool], say: Callable[[str], None]) -> Any:
        """``benches_model``: the recipe's model made on the host, before the board is touched."""
        raise EdgekitError(f"{self.name} has no bench without a release: deploy the recipe and bench the release.")

    def model_configs(self, site: BenchSite, model: Any, options: Mapping[str, Any]) -> list[ServerConfig]:
        """``benches_model``: [drafter, baseline] of that model, put on the board in the bench's work dir."""
        raise EdgekitError(f"{self.name} has no bench without a release: deploy the recipe and bench the release.")

    def model_record(self, model: Any) -> dict[str, Any]:
        """``benches_model``: what the results document keeps of the model (top-level keys)."""
        return {}

    # --- report ---------------------------------------------------------------------------------------------

    def report_ref(self, doc: dict[str, Any]) -> str:
        """How the report names what served a single-engine bench (its version where the document has it)."""
        return self.name

    def report_what(self, doc: dict[str, Any]) -> str | None:
        """``benches_model``: the report's line of what ran, for a model measured without a release."""
        return None

    # --- fleet ----------------------------------------------------------------------------------------------

    def fleet_releases(self, recipe: Recipe, targets: Mapping[str, FleetBoard], src: str | None, cuda: str,
                       console: Console) -> FleetReleases:
        """Every board's release for a fleet run; by default each as deploy makes it (its models made once,
        then from the store). The engine checks each board for its runtime first, before anything is sent."""
        from edgekit.engines.base import ReleaseContext

        out = FleetReleases()
        for name, t in targets.items():
            made = self.release(ReleaseContext(name, t.board, t.facts, recipe, t.runner, console,
                                               lambda m, n=name: console.print(f"[dim]fleet: {n}: {m}[/dim]"),
                                               src, cuda))
            out.plans[name] = made.plan
        return out
