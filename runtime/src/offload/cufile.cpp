#include "hectorgen/offload/cufile.h"

#include <dlfcn.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <thread>

namespace hectorgen::offload {
namespace {

// The parts of cufile.h's ABI that the engine uses.
struct CUfileError {
  int err;     // CUfileOpError, CU_FILE_SUCCESS = 0
  int cu_err;  // CUresult
};
constexpr int kHandleTypeOpaqueFd = 1;  // CU_FILE_HANDLE_TYPE_OPAQUE_FD
constexpr double kDefaultDriverOpenTimeoutS = 10.0;

double driver_open_timeout_s() {
  const char* text = std::getenv("HECTORGEN_OFFLOAD_GDS_TIMEOUT_S");
  if (text == nullptr || *text == '\0') {
    return kDefaultDriverOpenTimeoutS;
  }
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  return end != text && *end == '\0' && seconds > 0 ? seconds : kDefaultDriverOpenTimeoutS;
}
struct CUfileDescr {
  int type;
  union {
    int fd;
    void* handle;
  } handle;
  const void* fs_ops;
};

}  // namespace

struct CuFile::Api {
  CUfileError (*driver_open)() = nullptr;
  CUfileError (*driver_close)() = nullptr;
  CUfileError (*handle_register)(void** handle, CUfileDescr* descr) = nullptr;
  void (*handle_deregister)(void* handle) = nullptr;
  ssize_t (*read)(void* handle, void* device, std::size_t bytes, off_t file_offset, off_t device_offset) = nullptr;
  ssize_t (*write)(void* handle, const void* device, std::size_t bytes, off_t file_offset,
                   off_t device_offset) = nullptr;
};

CuFile::CuFile() {
  // libcufile logs to cufile.log in the working directory unless told otherwise; a probe that fails on a machine
  // without GPUDirect Storage should leave no file behind.
  setenv("CUFILE_LOGFILE_PATH", "/dev/null", /*overwrite=*/0);
  for (const char* name : {"libcufile.so.0", "libcufile.so", "libcufile.so.1"}) {
    library_ = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (library_ != nullptr) {
      break;
    }
  }
  if (library_ == nullptr) {
    reason_ = "libcufile is not installed (GPUDirect Storage unavailable)";
    return;
  }
  api_ = new Api;
  auto bind = [&](auto& function, const char* name, const char* alternative = nullptr) {
    void* symbol = dlsym(library_, name);
    if (symbol == nullptr && alternative != nullptr) {
      symbol = dlsym(library_, alternative);
    }
    function = reinterpret_cast<std::remove_reference_t<decltype(function)>>(symbol);
    return symbol != nullptr;
  };
  if (!bind(api_->driver_open, "cuFileDriverOpen") ||
      !bind(api_->driver_close, "cuFileDriverClose_v2", "cuFileDriverClose") ||
      !bind(api_->handle_register, "cuFileHandleRegister") ||
      !bind(api_->handle_deregister, "cuFileHandleDeregister") || !bind(api_->read, "cuFileRead") ||
      !bind(api_->write, "cuFileWrite")) {
    reason_ = "libcufile lacks the cuFile entry points";
    return;
  }
  // On its own thread, so that a driver that never answers costs a bounded wait, not the process.
  auto opened = std::make_shared<std::promise<CUfileError>>();
  std::future<CUfileError> result = opened->get_future();
  std::thread([opened, open = api_->driver_open] { opened->set_value(open()); }).detach();
  const double timeout_s = driver_open_timeout_s();
  if (result.wait_for(std::chrono::duration<double>(timeout_s)) != std::future_status::ready) {
    abandoned_ = true;
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%g", timeout_s);
    reason_ = std::string("cuFileDriverOpen did not return within ") + seconds +
              " s (no GPU or no nvidia-fs driver?)";
    return;
  }
  const CUfileError status = result.get();
  if (status.err != 0) {
    reason_ = "cuFileDriverOpen failed (error " + std::to_string(status.err) + ")";
    return;
  }
  driver_open_ = true;
}

CuFile::~CuFile() {
  if (abandoned_) {
    return;  // the probe's thread may still be inside the library
  }
  if (driver_open_) {
    api_->driver_close();
  }
  delete api_;
  if (library_ != nullptr) {
    dlclose(library_);
  }
}

void* CuFile::register_file(int fd) {
  if (!driver_open_) {
    return nullptr;
  }
  CUfileDescr descr{};
  descr.type = kHandleTypeOpaqueFd;
  descr.handle.fd = fd;
  void* handle = nullptr;
  const CUfileError status = api_->handle_register(&handle, &descr);
  if (status.err != 0) {
    reason_ = "cuFileHandleRegister failed (error " + std::to_string(status.err) + ")";
    return nullptr;
  }
  return handle;
}

void CuFile::deregister_file(void* handle) {
  if (handle != nullptr && driver_open_) {
    api_->handle_deregister(handle);
  }
}

ssize_t CuFile::write(void* handle, const void* device, std::size_t bytes, off_t file_offset) {
  return api_->write(handle, device, bytes, file_offset, 0);
}

ssize_t CuFile::read(void* handle, void* device, std::size_t bytes, off_t file_offset) {
  return api_->read(handle, device, bytes, file_offset, 0);
}

}  // namespace hectorgen::offload
