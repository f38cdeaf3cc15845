// Test helpers: load bundled specs (optionally with edited text) through the real front end.
#pragma once

#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "diag/diagnostics.h"
#include "driver/driver.h"
#include "ir/inter/ir.h"

namespace hectorgen::test {

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline std::string spec_path(const std::string& name) { return std::string(HECTORGEN_SOURCE_DIR) + "/specs/" + name; }

// Replaces the first occurrence of `from` (which must exist) with `to`.
inline std::string replace(std::string text, const std::string& from, const std::string& to) {
  size_t at = text.find(from);
  if (at == std::string::npos) throw std::runtime_error("test: pattern not found: " + from);
  return text.replace(at, from.size(), to);
}

struct Compiled {
  std::unique_ptr<SourceFile> file;
  Diagnostics diags;
  std::optional<inter::Module> module;
  std::string rendered() const {
    std::ostringstream s;
    diags.render(s);
    return s.str();
  }
};

inline std::unique_ptr<Compiled> compile_text(const std::string& path, const std::string& text) {
  auto c = std::make_unique<Compiled>();
  c->file = std::make_unique<SourceFile>(path, text);
  std::ostringstream log;
  c->module = driver::frontend(*c->file, c->diags, driver::Options{}, log);
  return c;
}

inline std::unique_ptr<Compiled> compile_spec(const std::string& name) {
  return compile_text(spec_path(name), read_file(spec_path(name)));
}

}  // namespace hectorgen::test
