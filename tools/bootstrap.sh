#!/usr/bin/env bash
# Installs what hectorgen needs to build and test, then configures and builds. Idempotent: installs only what
# is missing, rebuilds only what changed.
#   tools/bootstrap.sh [BUILD_DIR]      (default: build)
# Debian packages (apt): the compiler's build dependencies, and Python 3 with its headers and pip.
# From PyPI: the headers of the pinned torch, for the compile check of generated host code (tests/compile/);
# tools/torch_headers.py finds them (this Python's torch when it is that version) or fetches them into
# ~/.cache/hectorgen without installing anything into a Python environment. HECTORGEN_SKIP_HOST_COMPILE=1
# leaves them out (that check is then skipped; without it, the check fails when the headers are missing).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-$ROOT/build}"

apt_install() {  # the Debian packages of "$@" that are not installed yet
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  echo "bootstrap: installing ${missing[*]}"
  local sudo=""; [[ $(id -u) -ne 0 ]] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

apt_install cmake ninja-build g++ nlohmann-json3-dev libcli11-dev libfmt-dev libspdlog-dev catch2 libyaml-cpp-dev \
  python3
# The python3 on PATH compiles the generated Python and, with its headers, the host code. Debian's python3 gets
# them from apt; another Python (pyenv, a venv) brings its own.
if [[ "$(readlink -f "$(command -v python3)")" == /usr/bin/* ]]; then
  apt_install python3-dev python3-pip
fi

if [[ "${HECTORGEN_SKIP_HOST_COMPILE:-0}" != 0 ]]; then
  echo "bootstrap: HECTORGEN_SKIP_HOST_COMPILE is set: no torch headers (the host-code compile check is skipped)"
elif ! python3 "$ROOT/tools/torch_headers.py" install; then
  echo "bootstrap: WARNING: could not install the torch headers; the compile tests will fail" \
       "(HECTORGEN_SKIP_HOST_COMPILE=1 skips them)" >&2
fi

# FileCheck (LLVM's, from Debian's llvm-<N>-tools) for the pass tests (tests/passes); the newest packaged one.
if ! compgen -G "/usr/lib/llvm-*/bin/FileCheck" >/dev/null && ! command -v FileCheck >/dev/null; then
  tools_pkg="$(apt-cache search --names-only '^llvm-[0-9]+-tools$' 2>/dev/null | cut -d' ' -f1 | sort -V | tail -1)"
  if [[ -z "$tools_pkg" ]]; then
    SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
    $SUDO apt-get update -qq
    tools_pkg="$(apt-cache search --names-only '^llvm-[0-9]+-tools$' | cut -d' ' -f1 | sort -V | tail -1)"
  fi
  echo "bootstrap: installing $tools_pkg (FileCheck)"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$tools_pkg" >/dev/null
fi

GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
if [[ ! -f "$BUILD/CMakeCache.txt" ]]; then
  cmake -S "$ROOT" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
cmake --build "$BUILD" -j"$(nproc)"
