// Every generated file goes through an OutputSet: emitters add files to it, the driver writes it (a neutral
// header, so emit/ does not include driver/). Files are collected in memory while the pipeline runs and
// written only when it succeeded, each atomically (temp file + rename) and only if its content changed, so
// build systems see stable timestamps and a failed run leaves OUTDIR untouched.
#pragma once

#include <map>
#include <string>

namespace hectorgen {

class OutputSet {
 public:
  // `relpath` is relative to the output directory; a later add of the same path replaces it.
  void add(const std::string& relpath, std::string content) { files_[relpath] = std::move(content); }
  const std::map<std::string, std::string>& files() const { return files_; }

  // Writes every file under `dir` (created if missing). Returns an error message, empty on success.
  std::string commit(const std::string& dir) const;

 private:
  std::map<std::string, std::string> files_;
};

// Writes one file atomically if its content differs. Returns an error message, empty on success.
std::string write_file_atomically(const std::string& path, const std::string& content);

}  // namespace hectorgen
