// A stand-in for libcufile whose cuFileDriverOpen never returns, as the real one can on a machine without a GPU or
// the nvidia-fs driver. Built as libcufile.so.0 in a folder of its own; the test "[.gds-hang]" runs with that folder
// on LD_LIBRARY_PATH and checks that the engine's probe gives up after its timeout instead of hanging.
#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <thread>

namespace {
struct CUfileError {
  int err;
  int cu_err;
};
}  // namespace

extern "C" {

CUfileError cuFileDriverOpen() {
  for (;;) {
    std::this_thread::sleep_for(std::chrono::hours(1));
  }
}

CUfileError cuFileDriverClose() { return {0, 0}; }
CUfileError cuFileHandleRegister(void** handle, void*) {
  *handle = nullptr;
  return {5001, 0};
}
void cuFileHandleDeregister(void*) {}
ssize_t cuFileRead(void*, void*, std::size_t, off_t, off_t) { return -1; }
ssize_t cuFileWrite(void*, const void*, std::size_t, off_t, off_t) { return -1; }

}  // extern "C"
