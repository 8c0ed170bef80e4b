"""`exec`: start a service's program with its log and key file opened by the service's own user.

A unit that runs as the login user (``User=``) cannot let systemd open its log (``StandardOutput=append:``) or
read its environment file (``EnvironmentFile=``): systemd does both as root, before it changes user, so a
symlink in the user's directory would let the user write or read any file as root. The unit runs

    python3 -B <release>/agent/edgekit_agent.py exec --log LOG [--env-file FILE] [--key-file KEY] -- PROGRAM ARGS...

instead: this opens the log for appending and reads ``KEY=VALUE`` lines from the file as the user, then
replaces itself with the program, which stays the unit's main process.

``--key-file``: the server's API key file (``runtime.auth: key``), checked first (keyfile.read_key): llama-server
and vLLM cannot tell an empty or short key from a good one, so a bad file stops the start here, with one line
in the log and exit status 78 (EX_CONFIG), and the program never runs.
"""

from __future__ import annotations

import argparse
import os
import sys

from .keyfile import KeyFileError, read_key

EX_CONFIG = 78  # sysexits.h: a configuration error (here, the API key file)


def read_env_file(path: str) -> dict:
    """systemd's EnvironmentFile= subset edgekit writes: KEY=VALUE lines, # comments, optional quotes."""
    env = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line or line[0] in "#;" or "=" not in line:
                continue
            key, value = line.split("=", 1)
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            env[key.strip()] = value
    return env


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log", required=True, help="file to append stdout and stderr to")
    p.add_argument("--env-file", default=None, help="KEY=VALUE lines added to the environment")
    p.add_argument("--key-file", default=None,
                   help="the server's API key file: an empty, short or unreadable one stops the start (exit 78)")
    p.add_argument("argv", nargs=argparse.REMAINDER, help="-- PROGRAM ARGS...")


def main(args: argparse.Namespace) -> int:
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        print("exec: no program given", file=sys.stderr)
        return 2
    env = dict(os.environ)
    if args.env_file:
        env.update(read_env_file(args.env_file))
    fd = os.open(args.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    if args.key_file:
        try:
            read_key(args.key_file)
        except KeyFileError as exc:  # into the log: the unit's own output
            print(f"exec: refusing to start: {exc}", file=sys.stderr)
            return EX_CONFIG
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as exc:  # into the log: the unit's own output
        print(f"exec: cannot run {argv[0]}: {exc.strerror}", file=sys.stderr)
    return 127
