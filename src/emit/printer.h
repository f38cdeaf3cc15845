// A strict template printer: `$name$` holes (name an identifier) are replaced by variables; `$$` prints a
// dollar sign; any other `$` is literal (so CMake's `${VAR}` needs no escaping). A hole
// without a variable, or a variable no hole uses, is an error (a template and its caller drifting apart is
// a bug, not something to paper over). Multi-line values are indented to the column of their hole.
#pragma once

#include <map>
#include <stdexcept>
#include <string>

namespace hectorgen::emit {

using Vars = std::map<std::string, std::string>;

struct TemplateError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Renders template text. `name` is used in error messages.
std::string render(const std::string& name, const std::string& text, const Vars& vars);

// Renders an embedded template (templates/<path>).
std::string render_template(const std::string& path, const Vars& vars);

// A small code builder with RAII indentation for generated C++/CUDA/Python.
class CodeWriter {
 public:
  explicit CodeWriter(int indent_width = 2) : width_(indent_width) {}
  CodeWriter& line(const std::string& s = "");
  // Appends a multi-line block, each line at the current indentation.
  CodeWriter& block(const std::string& s);
  struct Indent {
    CodeWriter& w;
    explicit Indent(CodeWriter& writer) : w(writer) { ++w.depth_; }
    ~Indent() { --w.depth_; }
  };
  const std::string& str() const { return out_; }

 private:
  std::string out_;
  int depth_ = 0;
  int width_;
};

}  // namespace hectorgen::emit
