#!/usr/bin/env bash
# Installs edgekit the way a user runs it, on Debian 12 / Ubuntu 22.04+: the system packages a deploy and
# the no-hardware demo need, then edgekit-jetson[sim,fleet] from this checkout (or the wheel / pip
# requirement given as $1) into a virtualenv of its own, with `edgekit` linked into ~/.local/bin.
# Never `pip install edgekit`: that name on PyPI is another project (a Cloudflare Workers SDK).
#   bash install.sh && ~/.local/bin/edgekit demo
set -euo pipefail
# What to install: this checkout, or a wheel / pinned requirement you name (resolved before the cd below).
SPEC=${1:-}
case "$SPEC" in
  "") SPEC=".[sim,fleet]" ;;
  *" @ git+"* | https://* | file:* | /*) ;;
  *) if [ -e "${SPEC%%\[*}" ]; then SPEC="$(realpath "${SPEC%%\[*}")${SPEC#"${SPEC%%\[*}"}"
     else echo "install.sh: $SPEC is neither a file here nor a URL or pinned requirement; a bare name would come from a registry." >&2; exit 2; fi ;;
esac
cd "$(dirname "$0")"

PREFIX=${EDGEKIT_PREFIX:-$HOME/.local/share/edgekit-jetson}
BIN_DIR=${EDGEKIT_BIN_DIR:-$HOME/.local/bin}

# sshd: simulated boards; cmake, ninja, g++, git, patch (edgekit's llama.cpp patches): llama.cpp builds;
# python3-venv: the virtualenv below.
SYSTEM=(openssh-server openssh-client cmake ninja-build g++ git patch python3-venv)
need=()
for p in "${SYSTEM[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || need+=("$p"); done
if [ ${#need[@]} -gt 0 ]; then
  as_root=(); [ "$(id -u)" = 0 ] || as_root=(sudo)
  echo "install.sh: apt-get install ${need[*]}"
  "${as_root[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

python3 -m venv "$PREFIX/venv"
"$PREFIX/venv/bin/python" -m pip install -q --disable-pip-version-check "$SPEC"
mkdir -p "$BIN_DIR"
ln -sf "$PREFIX/venv/bin/edgekit" "$BIN_DIR/edgekit"
echo "install.sh: edgekit is $BIN_DIR/edgekit (its virtualenv: $PREFIX/venv)"
"$BIN_DIR/edgekit" doctor || true
