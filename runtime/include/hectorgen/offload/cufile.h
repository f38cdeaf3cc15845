// GPUDirect Storage through cuFile, loaded at run time: libcufile is opened with dlopen when an engine asks for it,
// so nothing links against it and a machine without it (or without the nvidia-fs driver, or with a filesystem GDS
// does not support) runs the POSIX path instead. Only the handful of entry points the engine uses are declared here,
// with the ABI of cufile.h.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <string>

namespace hectorgen::offload {

class CuFile {
 public:
  // Loads libcufile and opens the driver; available() says whether that worked and reason() why not. Opening the
  // driver can block for good (libcufile present on a machine without a GPU or nvidia-fs): it gets
  // $HECTORGEN_OFFLOAD_GDS_TIMEOUT_S seconds (default 10), then GDS counts as unavailable and the probe is
  // abandoned (its thread, and the library it is blocked in, stay until the process exits).
  CuFile();
  ~CuFile();
  CuFile(const CuFile&) = delete;
  CuFile& operator=(const CuFile&) = delete;

  bool available() const { return driver_open_; }
  const std::string& reason() const { return reason_; }

  // A registered handle for an open descriptor (O_DIRECT), or nullptr (reason() says why).
  void* register_file(int fd);
  void deregister_file(void* handle);
  // Bytes transferred or a negative error, as cuFileWrite / cuFileRead return them.
  ssize_t write(void* handle, const void* device, std::size_t bytes, off_t file_offset);
  ssize_t read(void* handle, void* device, std::size_t bytes, off_t file_offset);

 private:
  void* library_ = nullptr;
  bool driver_open_ = false;
  bool abandoned_ = false;  // the driver-open probe never returned: the library must stay loaded
  std::string reason_;
  struct Api;
  Api* api_ = nullptr;
};

}  // namespace hectorgen::offload
