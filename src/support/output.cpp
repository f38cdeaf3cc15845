#include "support/output.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace hectorgen {

namespace fs = std::filesystem;

std::string write_file_atomically(const std::string& path, const std::string& content) {
  std::error_code ec;
  {
    std::ifstream in(path, std::ios::binary);
    if (in) {
      std::ostringstream old;
      old << in.rdbuf();
      if (old.str() == content) return {};
    }
  }
  fs::path target(path);
  fs::path tmp = target.parent_path() / fmt::format(".{}.tmp{}", target.filename().string(), ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << content;
    out.flush();
    if (!out) {
      fs::remove(tmp, ec);
      return fmt::format("cannot write '{}': {}", tmp.string(), std::strerror(errno));
    }
  }
  fs::rename(tmp, target, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return fmt::format("cannot rename to '{}': {}", target.string(), ec.message());
  }
  return {};
}

std::string OutputSet::commit(const std::string& dir) const {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return fmt::format("cannot create output directory '{}': {}", dir, ec.message());
  // Stage everything first so a failure part-way leaves no mix of old and new files.
  std::map<std::string, fs::path> staged;
  for (const auto& [rel, content] : files_) {
    fs::path target = fs::path(dir) / rel;
    fs::create_directories(target.parent_path(), ec);
    if (ec) return fmt::format("cannot create '{}': {}", target.parent_path().string(), ec.message());
    std::ifstream in(target, std::ios::binary);
    if (in) {
      std::ostringstream old;
      old << in.rdbuf();
      if (old.str() == content) continue;  // unchanged: keep its timestamp
    }
    fs::path tmp = target.parent_path() / fmt::format(".{}.tmp{}", target.filename().string(), ::getpid());
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << content;
    out.flush();
    if (!out) {
      std::string err = fmt::format("cannot write '{}': {}", tmp.string(), std::strerror(errno));
      for (auto& [_, t] : staged) fs::remove(t, ec);
      fs::remove(tmp, ec);
      return err;
    }
    staged[target.string()] = tmp;
  }
  for (const auto& [target, tmp] : staged) {
    fs::rename(tmp, target, ec);
    if (ec) return fmt::format("cannot rename to '{}': {}", target, ec.message());
  }
  return {};
}

}  // namespace hectorgen
