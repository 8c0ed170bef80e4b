"""The root of the agent's zipapp: ``python3 <base>/agent/edgekit-agent-<hash>.pyz <verb> ...``.

In the zipapp the agent's modules sit in the package ``_edgekit_agent`` (edgekit.remote.agent_ship builds it), so
they keep their relative imports and no agent module can shadow a standard-library one.
"""

from __future__ import annotations

import importlib
import sys

if __name__ == "__main__":
    sys.exit(importlib.import_module("_edgekit_agent.cli").main())
