"""The llama.cpp builds the suite needs, made in the background of a CI run (conftest.py starts this at nice 19).

On a cold 2-core machine the two builds take ≈ 20 min of compiling, and most tests leave a core idle (vLLM's
start, sshd round trips, single-threaded unit tests): the builds take that idle time instead of holding up the
first test that needs them. A test that gets there first waits on the build's lock and finds the result in the
store; a failure here is only logged, and the test that needs the build reports it when it builds itself.
"""

from __future__ import annotations

import sys

from edgekit.build import BuildOptions, build, fetch_sdist, host_build_for_tests


def main() -> int:
    host = host_build_for_tests()  # what the sim boards run: most tests need it, so first
    print(f"host build {'found' if host.cached else 'made'}: {host.artifact.key}", flush=True)
    # The emulated boards' aarch64 release: its tests are ordered last (marker aarch64_release).
    cross = build(BuildOptions(target="orin", cpu_only=True, src=str(fetch_sdist())))
    print(f"aarch64 build {'found' if cross.cached else 'made'}: {cross.artifact.key}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
