#!/usr/bin/env bash
# Installs what hectorgen needs to build and test (Debian packages only), then configures and builds.
# Idempotent: installs only what is missing, rebuilds only what changed.
#   tools/bootstrap.sh [BUILD_DIR]      (default: build)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-$ROOT/build}"

PACKAGES=(cmake ninja-build g++ nlohmann-json3-dev libcli11-dev libfmt-dev libspdlog-dev catch2 libyaml-cpp-dev)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "bootstrap: installing ${missing[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
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
