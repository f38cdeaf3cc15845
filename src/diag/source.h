// Source files and locations. Every diagnostic points into a SourceFile by 1-based line and column.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace hectorgen {

class SourceFile {
 public:
  SourceFile(std::string path, std::string text);

  const std::string& path() const { return path_; }
  const std::string& text() const { return text_; }
  int line_count() const { return static_cast<int>(line_starts_.size()); }
  // Text of 1-based line `line`, without its newline; empty when out of range.
  std::string_view line(int line) const;
  // 1-based (line, column) of a byte offset.
  std::pair<int, int> position(size_t offset) const;

 private:
  std::string path_;
  std::string text_;
  std::vector<size_t> line_starts_;
};

struct SourceLoc {
  const SourceFile* file = nullptr;
  int line = 0;  // 1-based; 0 = unknown
  int col = 0;   // 1-based
  bool valid() const { return file != nullptr && line > 0; }
};

}  // namespace hectorgen
