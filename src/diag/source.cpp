#include "diag/source.h"

#include <algorithm>

namespace hectorgen {

SourceFile::SourceFile(std::string path, std::string text) : path_(std::move(path)), text_(std::move(text)) {
  line_starts_.push_back(0);
  for (size_t i = 0; i < text_.size(); ++i)
    if (text_[i] == '\n' && i + 1 < text_.size()) line_starts_.push_back(i + 1);
}

std::string_view SourceFile::line(int line) const {
  if (line < 1 || line > line_count()) return {};
  size_t begin = line_starts_[line - 1];
  size_t end = line < line_count() ? line_starts_[line] - 1 : text_.size();  // at the '\n' or the end
  if (line == line_count() && end > begin && text_[end - 1] == '\n') --end;
  if (end > begin && text_[end - 1] == '\r') --end;
  return std::string_view(text_).substr(begin, end - begin);
}

std::pair<int, int> SourceFile::position(size_t offset) const {
  offset = std::min(offset, text_.size());
  auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
  int line = static_cast<int>(it - line_starts_.begin());
  return {line, static_cast<int>(offset - line_starts_[line - 1]) + 1};
}

}  // namespace hectorgen
