"""Shared fixtures. Simulated boards: ``sim_boards(n=2, profile="orin", fresh=False)``.

    def test_probe(sim_boards):
        a, b = sim_boards(2)                  # two orin-agx-64gb boards (SimBoard objects)
        (thor,) = sim_boards(1, "thor")        # boards of another profile, same session
        (mine,) = sim_boards(1, fresh=True)    # a board no other test has used
        assert a.run("cat $EDGEKIT_BOARD_ROOT/etc/nv_tegra_release").rc == 0

Boards start on first use and stay up for the whole session (`sim down` at its end); a test
asking for N boards of a profile gets the first N of that profile, so tests share them — ask
for ``fresh=True`` when a test changes a board in ways others would notice. While a test that
uses ``sim_boards`` runs, EDGEKIT_CONFIG_DIR, EDGEKIT_SIM_DIR and EDGEKIT_CONFIG point into the
session's temp dir, so `edgekit` commands (CliRunner or subprocess) see these boards in their
board file and known_hosts, and nothing touches the user's own files. A module- or
session-scoped fixture of your own can use ``sim_session`` instead: ``sim_session.boards(...)``
(same signature) and ``sim_session.env`` (set those variables yourself).

Artifacts: deploys convert into edgekit's default store (content-addressed: llama.cpp builds, aligned
drafters, GGUFs, LiteRT-LM bundles). A fixture that makes what a deploy makes too converts into
``deploy_store`` (that store), so a run aligns and exports it once; the other convert tests share
``<basetemp>/edgekit-store``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from edgekit.config.profiles import get_profile
from edgekit.sim import boards as sim
from edgekit.sim import emulation
from edgekit.sim.testing import SimBoard
from edgekit.store import Store


@dataclass
class SimSession:
    root: Path
    made_in_test: list[SimBoard] | None = None  # fresh boards the running test made (None: between tests)

    @property
    def env(self) -> dict[str, str]:
        return {
            "EDGEKIT_CONFIG_DIR": str(self.root / "config"),
            # Not EDGEKIT_CACHE: llama.cpp builds and converted models stay in the shared cache.
            "EDGEKIT_SIM_DIR": str(self.root / "sim"),
            "EDGEKIT_CONFIG": str(self.root / "config" / "edgekit.yaml"),
        }

    @property
    def sim_dir(self) -> Path:
        return self.root / "sim"  # = edgekit.paths.sim_dir() under self.env

    @property
    def targets(self) -> sim.Targets:
        return sim.Targets(Path(self.env["EDGEKIT_CONFIG"]), Path(self.env["EDGEKIT_CONFIG_DIR"]) / "known_hosts")

    def boards(self, n: int = 2, profile: str = "orin", *, fresh: bool = False,
               jetpack: str | None = None, arch: str | None = None) -> list[SimBoard]:
        """``arch="aarch64"``: emulated boards (qemu-user), which get the aarch64 release."""
        canonical = get_profile(profile).name
        st, created, _ = sim.up(self.sim_dir, n, canonical, self.targets, add=fresh, jetpack=jetpack, arch=arch)
        line = None if jetpack in (None, get_profile(profile).jetpack) else jetpack
        emulated = emulation.board_arch(arch)
        pool = [b for b in sim.sorted_boards(st)
                if b.profile == canonical and b.jetpack == line and b.arch == emulated]
        if fresh:  # created now: a board restarted because its sshd died keeps what tests put on it
            pool = [b for b in pool if b.name in created]
        out = [SimBoard.from_state(st, b, self.targets.known_hosts) for b in pool[:n]]
        if fresh and self.made_in_test is not None:
            self.made_in_test.extend(out)
        return out

    def down(self) -> None:
        sim.down(self.sim_dir)


@pytest.fixture(scope="session")
def sim_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimSession]:
    session = SimSession(tmp_path_factory.mktemp("edgekit-sim"))
    try:
        yield session
    finally:
        session.down()


SERVING_UNITS = "edgekit-watchdog.service edgekit-serve.service edgekit-serve-candidate.service edgekit-llama.service"


@pytest.fixture(autouse=True)
def _fresh_boards_stop_serving(request: pytest.FixtureRequest) -> Iterator[None]:
    """A board a test made for itself (``fresh=True``) stops serving when that test ends: nobody asks it
    again, and on a 2-core CI an idle vLLM engine left running takes a tenth of a core from every later test.
    Boards of module- and session-scoped fixtures are made before this runs, and keep serving."""
    if "sim_session" not in request.fixturenames:
        yield
        return
    session: SimSession = request.getfixturevalue("sim_session")
    session.made_in_test = []
    try:
        yield
    finally:
        made, session.made_in_test = session.made_in_test, None
        for board in made:
            with contextlib.suppress(Exception):  # a board a test took down itself
                board.run(f"systemctl stop {SERVING_UNITS}", timeout=120)


@pytest.fixture(scope="session")
def agent_pyz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This edgekit's agent zipapp as a board gets it (edgekit.remote.agent_ship), to run with a python3."""
    from edgekit.remote import agent_ship

    path = tmp_path_factory.mktemp("agent") / agent_ship.app().name
    path.write_bytes(agent_ship.app().data)
    return path


@pytest.fixture
def sim_boards(sim_session: SimSession, monkeypatch: pytest.MonkeyPatch) -> Callable[..., list[SimBoard]]:
    """Factory: ``sim_boards(n=2, profile="orin", *, fresh=False, jetpack=None, arch=None) -> list[SimBoard]``."""
    for key, value in sim_session.env.items():
        monkeypatch.setenv(key, value)
    return sim_session.boards


@pytest.fixture(scope="session")
def deploy_store() -> Store:
    """The store the sim boards' deploys convert into: edgekit's default one (``EDGEKIT_STORE``, else
    ``~/.cache/edgekit/store``), as ``sim_session.env`` leaves it. A fixture that makes what a deploy makes too
    (a recipe's aligned drafter, its GGUFs, its LiteRT-LM bundle) takes it from here, so a run makes it once:
    alignment and exports are keyed on their inputs' content, so where it was made cannot change what it is."""
    return Store()


# In CI a skip is a failure: every test's needs are installed by .ci/install, so a test that skips there
# names something .ci/install forgot (or found only because someone installed it by hand elsewhere).
# Only skips for what a machine of this kind cannot have are allowed, each with its reason.
CI_ALLOWED_SKIPS = (
    "mounting a tiny tmpfs needs root",  # CI runs as root; a developer's machine may not
)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if not os.environ.get("CI") or not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = str(report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr)
    if not any(allowed in reason for allowed in CI_ALLOWED_SKIPS):
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, where .ci/install must provide what it needs: {reason}"


# The llama.cpp builds, made in the background of a CI run (prebuild.py says why); EDGEKIT_TEST_PREBUILD=1 asks for
# it elsewhere. The tests that need the aarch64 release run last, so its build has the whole run to finish in.
_prebuild: subprocess.Popen | None = None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "aarch64_release: needs the aarch64 llama.cpp release; runs last")
    config.addinivalue_line("markers", "sim: needs simulated boards, llama.cpp builds or generated models (set "
                                       "from the fixtures a test uses; `-m 'not sim'` is the fast lane)")


# What makes a test slow: a simulated board, the store deploys convert into; and the modules that build llama.cpp,
# generate, train or convert models, export LiteRT bundles, make venvs or start boards without those fixtures.
SIM_FIXTURES = frozenset({"sim_session", "sim_boards", "deploy_store"})
SIM_MODULES = frozenset({
    "test_align", "test_build_cuda", "test_build_host", "test_build_pipeline", "test_collection", "test_convert_gguf",
    "test_larger_models", "test_ordered_head",
    "test_convert_litert", "test_convert_tiny", "test_convert_verify", "test_engine_vllm", "test_heat",
    "test_installed", "test_least_privilege", "test_link_rate", "test_litert_mtp", "test_missing_extras",
    "test_published_on_board", "test_qat_native", "test_repack", "test_sim", "test_skeleton_worker", "test_spec_auto",
    "test_tinymodels_published", "test_torture", "test_transfer", "test_watchdog",
})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if SIM_FIXTURES & set(getattr(item, "fixturenames", ())) or item.module.__name__ in SIM_MODULES:
            item.add_marker(pytest.mark.sim)
    items.sort(key=lambda item: item.get_closest_marker("aarch64_release") is not None)  # stable: order kept


def pytest_collection_finish(session: pytest.Session) -> None:
    global _prebuild
    wanted = os.environ.get("CI") or os.environ.get("EDGEKIT_TEST_PREBUILD")
    needed = any(item.get_closest_marker("sim") for item in session.items)  # the fast lane builds nothing
    if not wanted or not needed or session.config.option.collectonly:
        return
    log_dir = Path(str(session.config.rootpath)) / ".pytest_cache"
    log_dir.mkdir(exist_ok=True)
    with open(log_dir / "prebuild.log", "w") as log:
        _prebuild = subprocess.Popen(["nice", "-n", "19", sys.executable, str(Path(__file__).with_name("prebuild.py"))],
                                     stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)


# Each lane's time in the run's log (CI's included): the sum of its tests' setup, call and teardown, which is what
# the lane takes alone, run by itself, less collection and start-up.
_lane_seconds: dict[str, float] = {}
_lane_tests: dict[str, set[str]] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    lane = "sim" if item.get_closest_marker("sim") else "fast"
    t0 = time.monotonic()
    yield
    _lane_seconds[lane] = _lane_seconds.get(lane, 0.0) + time.monotonic() - t0
    _lane_tests.setdefault(lane, set()).add(item.nodeid)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    names = {"fast": "fast lane (-m 'not sim')", "sim": "sim lane"}
    parts = [f"{names[lane]}: {len(_lane_tests[lane])} tests, {int(_lane_seconds[lane] // 60)} min "
             f"{_lane_seconds[lane] % 60:.0f} s" for lane in names if lane in _lane_tests]
    if parts:
        terminalreporter.write_line("; ".join(parts))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A build the run did not need after all (a few tests asked for) is stopped; ninja resumes it next time."""
    if _prebuild is None or _prebuild.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(_prebuild.pid, signal.SIGTERM)
    try:
        _prebuild.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(_prebuild.pid, signal.SIGKILL)
        _prebuild.wait()
