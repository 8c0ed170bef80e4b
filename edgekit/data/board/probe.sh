#!/bin/sh
# edgekit's board probe: what a board is, in one round trip, before edgekit knows whether the board has a python3
# for its agent. POSIX sh only (nothing to install on a board); sent to `sh -s -- BASE` on stdin, never kept there.
# Prints KEY=VALUE lines (edgekit.remote.probe parses them). On a real Jetson the files are read from /; a
# simulated board sets EDGEKIT_BOARD_ROOT (through sshd's SetEnv) and this same script reads its board root.
root="${EDGEKIT_BOARD_ROOT:-}"
base="$1"
# shellcheck disable=SC2088  # the literal "~/" of a board file's base, expanded here as the login's home
case "$base" in "~") base="$HOME" ;; "~/"*) base="$HOME/${base#\~/}" ;; esac
kv() { printf '%s=%s\n' "$1" "$2"; }
# The first line of a file into $line; builtins, not a process per file: every exec counts on a board
# that is probed on each deploy (and on simulated boards that share the workstation's cores).
first() { line=""; { IFS= read -r line; } 2>/dev/null < "$1"; }
first "$root/etc/nv_tegra_release"; kv l4t "$line"
model=""
for f in "$root/proc/device-tree/model" "$root/sys/firmware/devicetree/base/model"; do
  [ -r "$f" ] && { model="$(tr -d '\000' < "$f")"; break; }
done
kv model "$model"
kv cuda_json "$(tr -d '\n' 2>/dev/null < "$root/usr/local/cuda/version.json")"
un="$(uname -nrm)"  # node name, kernel release, machine: one process
kv arch "${un##* }"
kv glibc "$(getconf GNU_LIBC_VERSION 2>/dev/null)"
gpu=""  # the GPU's device node or CUDA driver library: Orin's nvgpu (JetPack 5/6), OpenRM's nvidia0 (Thor, JetPack 7)
for f in /dev/nvgpu/igpu0/ctrl /dev/nvhost-ctrl-gpu /dev/nvidia0 /usr/lib/aarch64-linux-gnu/nvidia/libcuda.so.1 \
         /usr/lib/aarch64-linux-gnu/tegra/libcuda.so.1; do
  [ -e "$root$f" ] && { gpu="$f"; break; }
done
kv gpu_driver "$gpu"
rest="${un#* }"
kv kernel "${rest% *}"
kv hostname "${un%% *}"
meminfo=/proc/meminfo; [ -r "$root/proc/meminfo" ] && meminfo="$root/proc/meminfo"
mem=""; avail=""; while read -r key value _; do
  case "$key" in MemTotal:) mem="$value" ;; MemAvailable:) avail="$value" ;; esac
done 2>/dev/null < "$meminfo"
kv mem_total_kb "$mem"
kv mem_available_kb "$avail"
d="$base"; while [ ! -d "$d" ] && [ "$d" != "/" ]; do d="$(dirname "$d")"; done
kv disk_free_kb "$(df -Pk "$d" 2>/dev/null | { read -r _; read -r _ _ _ avail _; printf '%s' "$avail"; })"
kv base "$base"
kv base_exists "$([ -d "$base" ] && echo 1 || echo 0)"
py="$(python3 -V 2>&1)"  # "Python 3.10.12": the version without starting the interpreter
case "$py" in "Python "[0-9]*) py="${py#Python }"; py="${py%%[!0-9.]*}" ;; *) py="" ;; esac
kv python "$py"
kv jtop_socket "$([ -S "$root/run/jtop.sock" ] && echo 1 || echo 0)"
kv jtop_bin "$(command -v jtop 2>/dev/null)"
kv tegrastats "$(command -v tegrastats 2>/dev/null)"
kv site_nginx "$(command -v nginx 2>/dev/null || { [ -x /usr/sbin/nginx ] && echo /usr/sbin/nginx; })"
kv site_aria2c "$(command -v aria2c 2>/dev/null)"
first "$root/var/lib/nvpmodel/status"; kv nvpmodel "$line"
kv user "$(id -un)"
# The helper `edgekit board setup --apply` installs is preferred to full sudo: edgekit then asks for no more.
helper="$root/usr/local/sbin/edgekit-root"
kv sudo "$( [ "$(id -u)" = 0 ] && echo root \
  || { [ -x "$helper" ] && sudo -n -l "$helper" >/dev/null 2>&1 && echo helper; } \
  || (sudo -n true 2>/dev/null && echo nopasswd || echo no) )"
kv helper "$helper"
kv helper_sha "$( [ -r "$helper" ] && { openssl dgst -sha256 -r "$helper" 2>/dev/null || sha256sum "$helper"; } \
  | cut -c1-64 )"
lib="$helper.d/unitspec.py"  # its renderer
kv helper_lib_sha "$( [ -r "$lib" ] && { openssl dgst -sha256 -r "$lib" 2>/dev/null || sha256sum "$lib"; } \
  | cut -c1-64 )"
kv groups "$(id -Gn)"
for dev in "$root"/sys/bus/i2c/devices/*; do
  [ -r "$dev/name" ] || continue
  first "$dev/name"; chip="$line"
  case "$chip" in ina3221|ina238|ina226) ;; *) continue ;; esac
  for hw in "$dev"/hwmon/hwmon*; do
    [ -d "$hw" ] || continue
    for lab in "$hw"/in*_label; do
      [ -r "$lab" ] || continue
      n="${lab##*/in}"; n="${n%_label}"
      first "$lab"; kv rail "$chip:${dev##*/}:${hw##*/}:$n:$line"
    done
    if [ "$chip" = ina238 ] && [ ! -e "$hw/in1_label" ] && [ -r "$hw/power1_input" ]; then
      kv rail "$chip:${dev##*/}:${hw##*/}:1:VIN"
    fi
  done
done
cur="$(readlink "$base/current" 2>/dev/null)"
kv current "${cur#releases/}"
# edgekit's llama.cpp patches the served llama.cpp was built with (edgekit.build.patches writes the list)
list="$base/current/bin/edgekit-patches.txt"
if [ -r "$list" ]; then
  kv llama_patches 1
  while IFS= read -r p; do [ -n "$p" ] && kv llama_patch "$p"; done < "$list"
fi
# The agent zipapps the board holds (edgekit.remote.agent_ship names them by their content hash).
for a in "$base"/agent/edgekit-agent-*.pyz; do
  if [ -f "$a" ]; then kv agent "${a##*/}"; fi
done
