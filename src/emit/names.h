// Identifiers of the generated code. The IR's names (the user's, and the derived ones with the sigil '$',
// ir/inter/names.h) become identifiers of C++/CUDA and Python through one small utility, NameScope: a name
// keeps its spelling unless it is reserved in the target (a keyword, a builtin, or any identifier the
// templates and the emitters themselves use) or already taken by another name; then it gets a deterministic
// suffix (`float` -> `float_`; a second `t_hs` -> `t_hs_`, a third `t_hs_2`). '$' is spelled '_' ('__' before a digit:
// the version att$0 is att__0). Public Python names (keyword arguments, parameter attributes) keep the
// user's spelling wherever Python allows it. What no target can carry (a model named like a module the
// generated code imports, ...) is reported by check_public_names().
#pragma once

#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "diag/diagnostics.h"
#include "ir/intra/intra.h"

namespace hectorgen::emit {

enum class Lang { Cpp, Python };

// The identifiers a text uses (comments, string literals, preprocessor lines and template holes $x$
// skipped; the expressions of Python f-strings kept). `after_dot`: include qualified names (x.name, and in
// C++ a::name and p->name).
std::set<std::string> identifiers(std::string_view text, Lang lang, bool after_dot = true);
// The attribute names a Python text uses on `objects` (self.x, g.x), and with `class_fields` the fields its
// classes declare (`    name: type`).
std::set<std::string> attribute_names(std::string_view text, const std::set<std::string>& objects, bool class_fields);

// Identifiers no user name may take in generated C++/CUDA: C++ keywords, TorchScript keywords (the op
// schema names its arguments), CUDA built-ins, macros the headers define, every identifier of the host and
// kernels templates, and the names the C++ emitters print.
const std::set<std::string>& cpp_reserved();
// In the generated Python module: keywords, every identifier its template and emitter use (builtins and
// module-level names included).
const std::set<std::string>& python_reserved();
// Attribute names of the generated nn.Module: keywords, torch.nn.Module's attributes, and the attributes the
// module's code uses on self. (Fields of the Graph dataclass avoid its fields, g's attributes and the module's names.)
const std::set<std::string>& python_attribute_reserved();

class NameScope {
 public:
  explicit NameScope(const std::set<std::string>& reserved) : reserved_(&reserved) {}
  // The identifier of IR name `name` in namespace `ns` (tensor, kernel, loop variable ...): allocated on
  // first use, then always the same. Distinct (ns, name) pairs get distinct identifiers.
  const std::string& get(const std::string& ns, const std::string& name);
  // The same, for a name that brings identifiers derived from it (`patterns`, each with one "{}" where the
  // identifier goes, e.g. "launch_{}"): the identifier is chosen so that every derived one is free too, and
  // all of them are taken.
  const std::string& get(const std::string& ns, const std::string& name, const std::vector<std::string>& patterns);
  // A new identifier near `hint` (for the emitters' own temporaries).
  std::string fresh(const std::string& hint);
  // Marks an identifier as used (it will be nobody's).
  void take(const std::string& ident) { taken_.insert(ident); }
  bool available(const std::string& ident) const { return !reserved_->count(ident) && !taken_.count(ident); }
  // '$' -> '_' ('__' before a digit).
  static std::string spell(std::string_view name);

 private:
  std::string allocate(const std::string& candidate, const std::vector<std::string>& patterns = {});
  const std::set<std::string>* reserved_;
  std::set<std::string> taken_;
  std::map<std::pair<std::string, std::string>, std::string> map_;
};

// The identifiers derived from a kernel's C++ name `kernel`: its launcher, launch_<kernel>, the workspaces its
// launcher may use (emit::Workspace), <kernel>_<what> for each `what` of kKernelWorkspaces, and the variants of the
// kernel its launcher may pick instead, <kernel>_<variant> for each of kKernelVariants (a gather sum's kernel for
// rows of few entries, <kernel>_rows). They are reserved with the kernel's name (with_cpp_names), so no tensor,
// kernel or other workspace takes one.
inline constexpr const char* kKernelWorkspaces[] = {"partial", "chunk_ptr", "tile_ptr", "w_t"};
inline constexpr const char* kKernelVariants[] = {"rows"};
std::string launcher_name(const std::string& kernel);
std::string workspace_name(const std::string& kernel, const std::string& what);

// The phases with every IR name (tensors, fields, kernels, loop variables) replaced by its C++/CUDA
// identifier, one scope for all phases (a name is spelled alike in the kernels, the header and the host code).
// Locals and hyper-parameters keep their IR names (they never become identifiers).
std::vector<intra::Program> with_cpp_names(const std::vector<intra::Program>& phases);

// The Python spelling of the spec's names in the generated module.
struct PythonNames {
  std::string model_class;                    // Rgat
  std::map<std::string, std::string> param;   // inputs and weights -> parameter of forward()
  std::map<std::string, std::string> attr;    // weights -> nn.Module attribute
};
PythonNames python_names(const inter::ModelDecl& decl);

// Positioned reserved-name errors for spec names that no generated module can carry: a model named like a
// Python keyword or a module the generated code (or a script beside it) imports, a hyper-parameter named
// like a parameter of the generated module's constructor. Returns false if any was reported.
bool check_public_names(const inter::ModelDecl& decl, Diagnostics& diags);

}  // namespace hectorgen::emit
