#include "emit/printer.h"

#include <fmt/format.h>

#include <cctype>
#include <set>

#include "emit/templates.h"

namespace hectorgen::emit {

std::string render(const std::string& name, const std::string& text, const Vars& vars) {
  std::string out;
  std::set<std::string> used;
  size_t line_start = 0;  // in `out`, to find the column of a hole
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c != '$') {
      out += c;
      if (c == '\n') line_start = out.size();
      continue;
    }
    // A hole is $identifier$; $$ prints '$'; any other '$' (CMake's ${VAR}, $<...>) is literal text.
    if (i + 1 < text.size() && text[i + 1] == '$') {
      out += '$';
      ++i;
      continue;
    }
    size_t end = i + 1;
    while (end < text.size() && (std::isalnum(static_cast<unsigned char>(text[end])) || text[end] == '_')) ++end;
    bool ident = end > i + 1 && !std::isdigit(static_cast<unsigned char>(text[i + 1]));
    if (!ident || end >= text.size() || text[end] != '$') {
      out += '$';
      continue;
    }
    std::string key = text.substr(i + 1, end - i - 1);
    i = end;
    auto it = vars.find(key);
    if (it == vars.end()) throw TemplateError(fmt::format("{}: no value for template variable '${}$'", name, key));
    used.insert(key);
    // Indent continuation lines of a multi-line value to the hole's column (when only spaces precede it).
    std::string prefix = out.substr(line_start);
    bool indent = prefix.find_first_not_of(' ') == std::string::npos;
    const std::string& v = it->second;
    for (size_t k = 0; k < v.size(); ++k) {
      out += v[k];
      if (v[k] == '\n') {
        line_start = out.size();
        if (indent && k + 1 < v.size() && v[k + 1] != '\n') out += prefix;
      }
    }
  }
  for (const auto& [k, _] : vars)
    if (!used.count(k)) throw TemplateError(fmt::format("{}: template variable '{}' is not used", name, k));
  return out;
}

std::string render_template(const std::string& path, const Vars& vars) {
  const auto& table = embedded_templates();
  auto it = table.find(path);
  if (it == table.end()) throw TemplateError(fmt::format("no embedded template '{}'", path));
  return render(path, it->second, vars);
}

CodeWriter& CodeWriter::line(const std::string& s) {
  if (!s.empty()) out_ += std::string(static_cast<size_t>(depth_ * width_), ' ') + s;
  out_ += '\n';
  return *this;
}

CodeWriter& CodeWriter::block(const std::string& s) {
  size_t start = 0;
  while (start < s.size()) {
    size_t end = s.find('\n', start);
    if (end == std::string::npos) end = s.size();
    line(s.substr(start, end - start));
    start = end + 1;
  }
  return *this;
}

}  // namespace hectorgen::emit
