# Sourced by bench/run.sh and bench/ddp_run.sh (needs WORK and the functions log and left, the seconds left):
# builds the hectorgen runtime (runtime/, CMake) for this GPU into $WORK/runtime-prefix unless the build there is
# of the same sources (a stamp of runtime/'s files) and architecture, so one build serves both scripts; sets RT and
# puts it on CMAKE_PREFIX_PATH.
# shellcheck shell=bash
RT="$WORK/runtime-prefix"
STAMP="$(find runtime -type f -not -path '*/build/*' -not -name '*.pyc' -not -name '_C*.so' | LC_ALL=C sort |
         xargs sha1sum | sha1sum | cut -c1-16)"
CAP='import torch; print("%d%d" % torch.cuda.get_device_capability(0))'
ARCH="${HECTORGEN_CUDA_ARCH:-$(python3 -c "$CAP" 2>/dev/null || echo 90)}"
if [[ -f "$RT/python/hectorgen_runtime/__init__.py" && "$(cat "$RT/stamp" 2>/dev/null)" == "$STAMP-$ARCH" ]]; then
  log "hectorgen runtime: $RT is current"
else
  log "hectorgen runtime: building for sm_$ARCH into $RT (log: $WORK/runtime.log)"
  rm -rf "$WORK/runtime-build" "$RT"
  args=(-S runtime -B "$WORK/runtime-build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$ARCH"
        -DCMAKE_PREFIX_PATH="$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')"
        -DPython3_EXECUTABLE="$(command -v python3)" -DHECTORGEN_RUNTIME_PYTHON_INSTALL_DIR=python)
  command -v ninja >/dev/null && args+=(-G Ninja)
  # shellcheck disable=SC2016  # $1, $2 expand in the inner shell
  if timeout -k 10 "$(( $(left) < 240 ? $(left) : 240 ))" bash -c 'cmake "${@:3}" && cmake --build "$1" &&
       cmake --install "$1" --prefix "$2"' _ "$WORK/runtime-build" "$RT" "${args[@]}" > "$WORK/runtime.log" 2>&1; then
    echo "$STAMP-$ARCH" > "$RT/stamp"
    log "hectorgen runtime: built in ${SECONDS}s so far"
  else
    log "hectorgen runtime: build FAILED; the end of $WORK/runtime.log:"
    tail -30 "$WORK/runtime.log"
  fi
fi
export CMAKE_PREFIX_PATH="$RT${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
