# Sourced by bench/run.sh and bench/ddp_run.sh (needs ROOT, WORK and a log function): sets HG to a wrapper
# ($WORK/bin/hectorgen) around the first hectorgen that runs here - $HECTORGEN, build/hectorgen, or the bundle
# build/hg_bundle/hectorgen (tools/gpu_check.sh --bundle) with its libraries - or to "" when none runs.
# shellcheck shell=bash disable=SC2034  # HG is read by the scripts that source this file
HG=""
HGW="$WORK/bin/hectorgen"
mkdir -p "$WORK/bin"
try_hg() { # try_hg BIN [LIBPATH...]: writes the wrapper with the first library path it runs with
  local bin="$1" libs
  shift
  [[ -x "$bin" ]] || return 1
  for libs in "$@"; do
    { echo '#!/bin/sh'
      [[ -n "$libs" ]] &&
        echo "LD_LIBRARY_PATH=\"$libs\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}\"; export LD_LIBRARY_PATH"
      echo "exec \"$bin\" \"\$@\""; } > "$HGW"
    chmod +x "$HGW"
    if "$HGW" --version >/dev/null 2>&1; then log "hectorgen: $bin ($("$HGW" --version))"; return 0; fi
  done
  return 1
}
B="$ROOT/build/hg_bundle"
if { [[ -n "${HECTORGEN:-}" ]] && try_hg "$HECTORGEN" ""; } || try_hg "$ROOT/build/hectorgen" "" ||
   try_hg "$B/hectorgen" "" "$B/lib" "$B/lib:$B/lib/std"; then
  HG="$HGW"
else
  log "hectorgen: none runs here (carry build/hg_bundle: tools/gpu_check.sh --bundle); using the committed generated/"
fi
