"""Before a byte is sent: does the board have the memory the release needs? Its models, its KV cache at the
recipe's context and the runtime (edgekit.release.memory) against what the board's kernel says is available
(MemAvailable: on a Jetson the GPU takes from the same memory), not its total."""

from __future__ import annotations

from edgekit.errors import EdgekitError
from edgekit.release.manifest import ReleaseManifest
from edgekit.release.memory import models_mb, need_of
from edgekit.release.plan import ReleasePlan
from edgekit.remote import releases
from edgekit.remote.probe import BoardFacts
from edgekit.remote.runner import Runner


def check(runner: Runner, name: str, facts: BoardFacts, plan: ReleasePlan, kv_bytes: int, in_place: bool) -> None:
    """Refuse, in one sentence with the numbers, a release the board's memory cannot hold. In place, the server
    it replaces stops first: its models' memory counts as free. A release the board serves already passes."""
    available = facts.mem_available_mb
    need = need_of(plan, kv_bytes)
    if available is None or need.total_mb <= available:
        return
    lay = releases.layout(runner, facts.base)
    if lay.current == plan.release_id:
        return  # it runs already: the memory it needs is what it holds
    frees = 0.0
    if in_place and lay.current:
        current = ReleaseManifest.read(releases.read_manifest(runner, facts.base, lay.current),
                                       f"release {lay.current} on board {name!r}")
        frees = models_mb({rel: entry.size for rel, entry in current.files.items()})
    if need.total_mb <= available + frees:
        return
    freed = f" (+{frees:.0f} MB its current release frees as it stops)" if frees else ""
    raise EdgekitError(
        f"Board {name!r} has {available} MB of memory available{freed} but release {plan.release_id} needs "
        f"{need.describe()}; nothing was sent and what the board serves is unchanged. Free memory on the board, "
        "or lower runtime.ctx_size (or runtime.parallel), or choose a smaller model.")
