"""Entry point on the board: ``python3 <release>/agent/edgekit_agent.py <subcommand> ...``.

Run as a script, this file loads its own directory as a package (named ``_edgekit_agent``,
whatever the directory is called) so the agent's modules keep their relative imports; and it takes
that directory off sys.path, so no agent module can shadow a standard-library one.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Callable

PACKAGE = "_edgekit_agent"


def _load_main() -> Callable[[], int]:
    if __package__:  # imported as part of a package (edgekit.agent.edgekit_agent)
        from .cli import main

        return main
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.util.spec_from_file_location(PACKAGE, os.path.join(here, "__init__.py"),
                                                  submodule_search_locations=[here])
    assert spec is not None and spec.loader is not None
    pkg = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = pkg
    spec.loader.exec_module(pkg)
    return importlib.import_module(PACKAGE + ".cli").main


if __name__ == "__main__":
    sys.exit(_load_main()())
