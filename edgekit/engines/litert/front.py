"""LiteRT-LM's bundle and the front that serves it: what the release and the bench of that engine share
(where the bundle lives in a release, how the front starts, which Python on the board runs it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from edgekit.config.boardfile import Board
from edgekit.config.recipes import Recipe
from edgekit.engines.litert.settings import SECTION, LitertBoardSettings
from edgekit.errors import EdgekitError
from edgekit.remote import agent_call
from edgekit.remote.runner import LocalRunner, SshRunner
from edgekit.store import Store

Runner = SshRunner | LocalRunner
BUNDLE = "models/model.litertlm"


def bundle_for(recipe: Recipe, store: Store | None = None,
               say: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    """The recipe's LiteRT-LM bundle (exported once, then from the store), whatever its ``convert.litert``."""
    from edgekit.prepare.pipeline import convert_recipe

    if recipe.drafter is not None and recipe.runtime.spec_type != "draft-mtp":
        raise EdgekitError(f"Recipe {recipe.name} drafts with {recipe.runtime.spec_type}; LiteRT-LM drafts with "
                           "an MTP drafter only (spec_type draft-mtp).")
    result = convert_recipe(recipe, store, say=say, formats=("litertlm",))
    if not result.litert:
        raise EdgekitError(f"Recipe {recipe.name}'s target is not converted by edgekit (a package): "
                           "there is no LiteRT-LM bundle to serve.")
    return result.litert[0]


def board_python(runner: Runner, base: str, board_name: str, python: str,
                 flag: str = "`litert.python` in the board file") -> str:
    """``python`` if it can import ``litert_lm`` on the board (the agent's `python-has`, run by that Python), else
    one clear sentence."""
    res = agent_call.run(runner, base, "python-has", "--module", "litert_lm", timeout=120, python=python)
    got = agent_call.answer(res)
    if res.exit_code == 127:
        failed = "no such program"
    elif not res.ok or got is None:
        failed = agent_call.why(res)
    else:
        failed = (got.get("modules") or {}).get("litert_lm")
    if failed:
        raise EdgekitError(f"Board {board_name!r}: {python} cannot import litert_lm ({failed}); install "
                           f"litert-lm-api==0.18.1 there (pip) or name a Python that has it with {flag}.")
    return python


def python_of(board: Board) -> str:
    """The board's Python with LiteRT-LM: the board file's `litert.python`, else python3."""
    return LitertBoardSettings.model_validate(board.section(SECTION)).python or "python3"


def front_argv(python: str, rdir: str, bundle: str, host: str, port: int, cache_length: int,
               draft_steps: int | None, accelerator: str, cache_dir: str, key_file: str | None = None,
               chat_template: str | None = None) -> list[str]:
    """The front on ``port``, as a release's units run it (the agent's file the release carries): the bundle with
    its MTP drafter when ``draft_steps``, else the target alone (``key_file``: every request but /health needs the
    key it holds; ``chat_template``: a template file that replaces the bundle's own)."""
    return [python, f"{rdir}/agent/litert_server.py", *front_args(bundle, host, port, cache_length, draft_steps,
                                                                   accelerator, cache_dir, key_file, chat_template)]


def agent_front(python: str, agent: str) -> list[str]:
    """The front as the bench runs it before any release carries it: the agent zipapp's ``litert-front`` verb,
    under the board's LiteRT-LM Python."""
    return [python, agent, "litert-front"]


def front_args(bundle: str, host: str, port: int, cache_length: int, draft_steps: int | None, accelerator: str,
               cache_dir: str, key_file: str | None = None, chat_template: str | None = None) -> list[str]:
    argv = ["--model", bundle, "--host", host, "--port", str(port),
            "--ctx", str(cache_length), "--cache-dir", cache_dir, "--accelerator", accelerator]
    argv += ["--api-key-file", key_file] if key_file else []
    argv += ["--chat-template-file", chat_template] if chat_template else []
    return [*argv, "--speculative", "--draft-steps", str(draft_steps)] if draft_steps else argv
