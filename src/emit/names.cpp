// Identifiers of the generated code (see names.h).
#include "emit/names.h"

#include <fmt/format.h>

#include <cctype>
#include <cstring>
#include <functional>
#include <utility>

#include "emit/templates.h"
#include "ir/inter/names.h"

namespace hectorgen::emit {

using namespace inter;
using intra::Program;

namespace {

using Names = std::set<std::string>;

// ---- what the target languages reserve ------------------------------------------------------------
const char* const kCppKeywords[] = {
    "alignas", "alignof", "and", "and_eq", "asm", "auto", "bitand", "bitor", "bool", "break", "case", "catch", "char",
    "char8_t", "char16_t", "char32_t", "class", "compl", "concept", "const", "consteval", "constexpr", "constinit",
    "const_cast", "continue", "co_await", "co_return", "co_yield", "decltype", "default", "delete", "do", "double",
    "dynamic_cast", "else", "enum", "explicit", "export", "extern", "false", "final", "float", "for", "friend", "goto",
    "if", "import", "inline", "int", "long", "module", "mutable", "namespace", "new", "noexcept", "not", "not_eq",
    "nullptr", "operator", "or", "or_eq", "override", "private", "protected", "public", "register",
    "reinterpret_cast", "requires", "return", "short", "signed", "sizeof", "static", "static_assert", "static_cast",
    "struct", "switch", "template", "this", "thread_local", "throw", "true", "try", "typedef", "typeid", "typename",
    "union", "unsigned", "using", "virtual", "void", "volatile", "wchar_t", "while", "xor", "xor_eq"};

// Python keywords; TorchScript's lexer (which parses the op schemas of the host code) adds two.
const char* const kPythonKeywords[] = {
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue", "def", "del",
    "elif", "else", "except", "finally", "for", "from", "global", "if", "import", "in", "is", "lambda", "nonlocal",
    "not", "or", "pass", "raise", "return", "try", "while", "with", "yield"};
const char* const kTorchScriptKeywords[] = {"Ellipsis", "NoneType"};

// CUDA built-in variables and device functions, and object-like macros of the C, CUDA and torch headers
// (`linux` and `unix` are predefined in GNU mode): a parameter with one of these names breaks the build.
const char* const kCudaAndMacros[] = {
    "threadIdx", "blockIdx", "blockDim", "gridDim", "warpSize", "atomicAdd", "atomicSub", "atomicMax", "atomicMin",
    "atomicExch", "atomicCAS", "min", "max", "fminf", "fmaxf", "fabsf", "expf", "logf", "sqrtf", "rsqrtf", "tanhf",
    "powf", "exp", "log", "sqrt", "tanh", "pow", "abs", "printf", "malloc", "free", "memcpy", "memset", "dim3",
    "float2", "float4", "int2", "int4", "uint3", "half", "size_t", "int8_t", "int16_t", "int32_t", "int64_t",
    "uint8_t", "uint16_t", "uint32_t", "uint64_t", "NULL", "EOF", "errno", "stdin", "stdout", "stderr", "assert",
    "offsetof", "linux", "unix", "i386", "major", "minor", "makedev", "INFINITY", "NAN", "HUGE_VAL", "HUGE_VALF",
    "CHAR_BIT", "INT_MAX", "INT_MIN", "FLT_MAX", "FLT_MIN", "M_PI", "std", "at", "c10", "torch", "pybind11", "cub",
    "thrust", "hectorgen"};

// Fixed identifiers the C++ emitters print where user names also appear (traversal kernels, Args structs,
// the host functions). A unit test checks that generated code uses no other fixed identifier.
const char* const kCppEmitterNames[] = {
    // traversal kernels (emit/traversal.cpp) and launchers (emit/cuda.cpp)
    "lane", "first_row", "row_stride", "num_rows", "j", "m", "idx", "partial", "total", "warp_sum", "warp_max", "leaky_relu",
    "row_group", "warp_row", "first_warp_row", "row_live", "live", "group_sum", "group_max", "kRowLanes", "__reduce_max_sync",
    "run", "load_run", "store_run", "run_to_float", "run_from_float", "RunWord", "RunChunk", "run_word", "run_values",
    "run_addr", "kRun", "RunElem", "kRunBytes", "kRunPer", "uint2", "uint4",
    "__shfl_sync", "__shfl_xor_sync", "a", "args", "stream", "err", "grid", "blocks", "cudaError_t",
    "cudaGetLastError", "cudaSuccess", "cudaStream_t", "hectorgen", "rows", "nullptr",
    // split-K launchers (emit/cuda.cpp emit_wgrad, emit_segsum) and tensor-core ones (emit_tc_gemm)
    "wgrad", "chunk_rows", "chunk_ptr", "gemm",
    // graph arrays and sizes (Args structs, op arguments)
    "src", "dst", "etype", "etype_ptr", "etype_tile_ptr", "in_ptr", "in_eid", "in_src", "out_ptr", "out_eid",
    "out_dst", "ntype", "ntype_ptr", "ntype_tile_ptr", "num_nodes", "num_edges", "num_etypes", "num_ntypes",
    "pair_src", "pair_etype_ptr", "pair_tile_ptr", "edge_pair", "in_pair", "in_etype", "out_etype", "pair_edge_ptr",
    "pair_edge_eid", "node_pair_ptr", "node_pair", "num_pairs", "segment_of", "warp_segment_of",
    // host functions (emit/host.cpp) and PyTorch fallbacks (emit/torch_fallback.cpp)
    "check", "shape_str", "device", "guard", "options", "grad_mask", "empty_if", "zeros_if", "needed", "src_l", "dst_l", "etype_l", "ntype_l", "edge_pair_l", "C10_CUDA_CHECK",
    "TORCH_CHECK", "Tensor"};

// Fixed identifiers of the Python emitter (emit/host.cpp: the autograd Function).
const char* const kPythonEmitterNames[] = {
    "self", "cls", "forward", "backward", "TRAINABLE", "_NUM_OUTPUTS", "_NUM_INPUTS", "_GRAD_SLOTS", "SAVED_FOR_BACKWARD", "_Function",
    "ctx", "g", "tensors", "res", "outs", "saved", "grads", "stored", "device", "d_outs", "d", "s", "result", "r",
    "i", "t", "o", "zip", "torch", "staticmethod", "super", "isinstance", "tuple", "any", "None", "grad_mask", "sum",
    // an untrainable module (emit/host.cpp: python_untrainable)
    "NO_BACKWARD_REASON", "_ARGUMENT_NAMES", "_refuse_grad", "names", "n", "RuntimeError", "join",
    // a materialization: auto module (emit/host.cpp: python_auto_constants, the forward's program choice)
    "MATERIALIZATION", "WEIGHTS", "training", "program"};

// Modules a model's file (<model>.py) would shadow for the generated code, or for torch and scripts run
// beside it: Python's standard library and the packages torch imports.
const char* const kPythonModules[] = {
    "abc", "aifc", "argparse", "array", "ast", "asynchat", "asyncio", "asyncore", "atexit", "audioop", "base64",
    "bdb", "binascii", "bisect", "builtins", "bz2", "cProfile", "calendar", "cgi", "cgitb", "chunk", "cmath", "cmd",
    "code", "codecs", "codeop", "collections", "colorsys", "compileall", "concurrent", "configparser", "contextlib",
    "contextvars", "copy", "copyreg", "crypt", "csv", "ctypes", "curses", "dataclasses", "datetime", "dbm", "decimal",
    "difflib", "dis", "distutils", "doctest", "email", "encodings", "ensurepip", "enum", "errno", "faulthandler",
    "fcntl", "filecmp", "fileinput", "fnmatch", "fractions", "ftplib", "functools", "gc", "genericpath", "getopt",
    "getpass", "gettext", "glob", "graphlib", "grp", "gzip", "hashlib", "heapq", "hmac", "html", "http", "idlelib",
    "imaplib", "imghdr", "imp", "importlib", "inspect", "io", "ipaddress", "itertools", "json", "keyword", "lib2to3",
    "linecache", "locale", "logging", "lzma", "mailbox", "mailcap", "marshal", "math", "mimetypes", "mmap",
    "modulefinder", "msilib", "msvcrt", "multiprocessing", "netrc", "nis", "nntplib", "nt", "ntpath", "nturl2path",
    "numbers", "opcode", "operator", "optparse", "os", "ossaudiodev", "pathlib", "pdb", "pickle", "pickletools",
    "pipes", "pkgutil", "platform", "plistlib", "poplib", "posix", "posixpath", "pprint", "profile", "pstats", "pty",
    "pwd", "py_compile", "pyclbr", "pydoc", "pydoc_data", "pyexpat", "queue", "quopri", "random", "re", "readline",
    "reprlib", "resource", "rlcompleter", "runpy", "sched", "secrets", "select", "selectors", "shelve", "shlex",
    "shutil", "signal", "site", "smtpd", "smtplib", "sndhdr", "socket", "socketserver", "spwd", "sqlite3",
    "sre_compile", "sre_constants", "sre_parse", "ssl", "stat", "statistics", "string", "stringprep", "struct",
    "subprocess", "sunau", "symtable", "sys", "sysconfig", "syslog", "tabnanny", "tarfile", "telnetlib", "tempfile",
    "termios", "textwrap", "this", "threading", "time", "timeit", "tkinter", "token", "tokenize", "tomllib", "trace",
    "traceback", "tracemalloc", "tty", "turtle", "turtledemo", "types", "typing", "unicodedata", "unittest",
    "urllib", "uu", "uuid", "venv", "warnings", "wave", "weakref", "webbrowser", "winreg", "winsound", "wsgiref",
    "xdrlib", "xml", "xmlrpc", "zipapp", "zipfile", "zipimport", "zlib", "zoneinfo",
    // packages torch and the generated code import
    "torch", "torchgen", "numpy", "typing_extensions", "sympy", "mpmath", "networkx", "jinja2", "markupsafe",
    "fsspec", "filelock", "triton", "setuptools", "pkg_resources", "pybind11", "hectorgen_runtime"};

// Attributes of every torch.nn.Module (dir(torch.nn.Module()) of torch 2.11, dunders left out: names starting
// with '__' are reserved already). A parameter with one of these names cannot be registered.
const char* const kModuleAttributes[] = {
    "T_destination", "_apply", "_backward_hooks", "_backward_pre_hooks", "_buffers", "_call_impl",
    "_compiled_call_impl", "_forward_hooks", "_forward_hooks_always_called", "_forward_hooks_with_kwargs",
    "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_get_backward_hooks", "_get_backward_pre_hooks",
    "_get_name", "_is_full_backward_hook", "_load_from_state_dict", "_load_state_dict_post_hooks",
    "_load_state_dict_pre_hooks", "_maybe_warn_non_full_backward_hook", "_modules", "_named_members",
    "_non_persistent_buffers_set", "_parameters", "_register_load_state_dict_pre_hook", "_register_state_dict_hook",
    "_replicate_for_data_parallel", "_save_to_state_dict", "_slow_forward", "_state_dict_hooks",
    "_state_dict_pre_hooks", "_version", "_wrapped_call_impl", "add_module", "apply", "bfloat16", "buffers",
    "call_super_init", "children", "compile", "cpu", "cuda", "double", "dump_patches", "eval", "extra_repr", "float",
    "forward", "get_buffer", "get_extra_state", "get_parameter", "get_submodule", "half", "ipu", "load_state_dict",
    "modules", "mtia", "named_buffers", "named_children", "named_modules", "named_parameters", "parameters",
    "register_backward_hook", "register_buffer", "register_forward_hook", "register_forward_pre_hook",
    "register_full_backward_hook", "register_full_backward_pre_hook", "register_load_state_dict_post_hook",
    "register_load_state_dict_pre_hook", "register_module", "register_parameter", "register_state_dict_post_hook",
    "register_state_dict_pre_hook", "requires_grad_", "set_extra_state", "set_submodule", "share_memory",
    "state_dict", "to", "to_empty", "train", "training", "type", "xpu", "zero_grad"};

// The templates user names are substituted into (the GEMM and segment-sum kernels take only fixed parameters: no
// user name enters them).
const char* const kCppTemplates[] = {"host/host.cpp.in", "host/op.cpp.in", "cuda/kernels.cu.in", "cuda/kernels.h.in"};
const char* const kPythonTemplate = "python/module.py.in";
// Every template of the Python module: the module, and the graph API a non-auto or an auto module holds.
const char* const kPythonTemplates[] = {kPythonTemplate, "python/graph_api.py.in", "python/auto.py.in"};

template <size_t N>
void add(Names& s, const char* const (&list)[N]) {
  s.insert(std::begin(list), std::end(list));
}

const std::string& template_text(const char* path) {
  const auto& all = embedded_templates();
  auto it = all.find(path);
  if (it == all.end()) throw std::logic_error(fmt::format("names: no template {}", path));
  return it->second;
}

bool ident_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool ident_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// Calls f(identifier, qualifier) for the identifiers of a text (see identifiers()); the qualifier of x.name
// is "x" (any expression before the dot: ".").
void scan(std::string_view s, Lang lang, const std::function<void(std::string, std::string)>& f) {
  size_t i = 0;
  bool line_start = true;
  char prev = 0;  // the last significant character
  std::string last, qualifier;  // the last identifier; what precedes the last dot
  while (i < s.size()) {
    char c = s[i];
    if (c == '\n') {
      line_start = true;
      ++i;
      continue;
    }
    if (c == ' ' || c == '\t' || c == '\r') { ++i; continue; }
    bool at_line_start = std::exchange(line_start, false);
    // comments and preprocessor lines
    if ((lang == Lang::Python && c == '#') || (lang == Lang::Cpp && c == '#' && at_line_start) ||
        (lang == Lang::Cpp && c == '/' && i + 1 < s.size() && s[i + 1] == '/')) {
      while (i < s.size() && s[i] != '\n') ++i;
      continue;
    }
    if (lang == Lang::Cpp && c == '/' && i + 1 < s.size() && s[i + 1] == '*') {
      size_t end = s.find("*/", i + 2);
      i = end == std::string_view::npos ? s.size() : end + 2;
      continue;
    }
    // template holes $name$, with what is glued to them (k$Model$GemmTile is no identifier of its own)
    auto hole_end = [&](size_t at) -> size_t {  // past the hole starting at `at`, or `at` if none starts there
      if (at >= s.size() || s[at] != '$') return at;
      size_t end = at + 1;
      while (end < s.size() && ident_char(s[end])) ++end;
      return end < s.size() && s[end] == '$' && end > at + 1 ? end + 1 : at;
    };
    auto skip_glued = [&](size_t at) {
      while (true) {
        size_t next = hole_end(at);
        while (next < s.size() && ident_char(s[next])) ++next;
        if (next == at) return at;
        at = next;
      }
    };
    if (c == '$') {
      size_t end = hole_end(i);
      i = end == i ? i + 1 : skip_glued(end);
      prev = '$';
      continue;
    }
    // strings (Python: with prefixes; the expressions of f-strings are code)
    size_t prefix = 0;
    bool fstring = false;
    if (lang == Lang::Python) {
      while (prefix < 2 && i + prefix < s.size() && std::strchr("rRbBuUfF", s[i + prefix])) {
        fstring |= s[i + prefix] == 'f' || s[i + prefix] == 'F';
        ++prefix;
      }
      if (i + prefix >= s.size() || (s[i + prefix] != '"' && s[i + prefix] != '\'') || (i > 0 && ident_char(s[i - 1]))) {
        prefix = 0;
        fstring = false;
      }
    }
    char q = s[i + prefix];
    if ((q == '"' || q == '\'') && (prefix > 0 || !ident_char(c))) {
      size_t b = i + prefix;
      bool triple = lang == Lang::Python && s.substr(b, 3) == std::string(3, q);
      std::string_view close = triple ? std::string_view(&s[b], 3) : std::string_view(&s[b], 1);
      size_t j = b + close.size();
      std::string code;  // f-string expressions
      int depth = 0;
      while (j < s.size() && s.substr(j, close.size()) != close) {
        if (s[j] == '\\') { j += 2; continue; }
        if (!triple && s[j] == '\n') break;
        if (fstring && s[j] == '{' && j + 1 < s.size() && s[j + 1] == '{' && depth == 0) { j += 2; continue; }
        if (fstring && s[j] == '{') ++depth;
        else if (fstring && s[j] == '}' && depth > 0) { --depth; code += ' '; }
        else if (depth > 0) code += s[j];
        ++j;
      }
      i = std::min(s.size(), j + close.size());
      if (!code.empty()) scan(code, lang, f);
      prev = q;
      continue;
    }
    if (ident_start(c)) {
      size_t b = i;
      while (i < s.size() && ident_char(s[i])) ++i;
      if (hole_end(i) != i) {  // glued to a hole: a templated identifier
        i = skip_glued(i);
        prev = 'a';
        last.clear();
        continue;
      }
      last = std::string(s.substr(b, i - b));
      f(last, prev == '.' ? qualifier : "");
      prev = 'a';
      continue;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {  // numbers, with suffixes and exponents (1.0f, 0xffu)
      while (i < s.size() && (ident_char(s[i]) || s[i] == '.')) ++i;
      prev = '0';
      continue;
    }
    if (c == '.') qualifier = prev == 'a' ? last : ".";
    // C++ qualifies with :: and -> too (at::zeros, p->x): members are not names of the scope either.
    if (lang == Lang::Cpp && ((c == ':' && i + 1 < s.size() && s[i + 1] == ':') ||
                              (c == '-' && i + 1 < s.size() && s[i + 1] == '>'))) {
      qualifier = prev == 'a' ? last : ".";
      prev = '.';
      i += 2;
      continue;
    }
    prev = c;
    ++i;
  }
}

}  // namespace

std::set<std::string> identifiers(std::string_view text, Lang lang, bool after_dot) {
  Names out;
  scan(text, lang, [&](std::string id, const std::string& qualifier) {
    if (after_dot || qualifier.empty()) out.insert(std::move(id));
  });
  return out;
}

std::set<std::string> attribute_names(std::string_view text, const std::set<std::string>& objects, bool class_fields) {
  Names out;
  scan(text, Lang::Python, [&](std::string id, const std::string& qualifier) {
    if (objects.count(qualifier)) out.insert(std::move(id));
  });
  if (!class_fields) return out;
  // Class-level declarations `    name: type` (the fields of a dataclass).
  size_t at = 0;
  while (at < text.size()) {
    size_t end = std::min(text.find('\n', at), text.size());
    std::string_view line = text.substr(at, end - at);
    if (line.size() > 5 && line.substr(0, 4) == "    " && ident_start(line[4])) {
      size_t i = 4;
      while (i < line.size() && ident_char(line[i])) ++i;
      if (i + 1 < line.size() && line[i] == ':' && line[i + 1] == ' ') out.insert(std::string(line.substr(4, i - 4)));
    }
    at = end + 1;
  }
  return out;
}

const std::set<std::string>& cpp_reserved() {
  static const Names names = [] {
    Names s;
    add(s, kCppKeywords);
    add(s, kPythonKeywords);
    add(s, kTorchScriptKeywords);
    add(s, kCudaAndMacros);
    add(s, kCppEmitterNames);
    for (const char* t : kCppTemplates) s.merge(identifiers(template_text(t), Lang::Cpp));
    return s;
  }();
  return names;
}

const std::set<std::string>& python_reserved() {
  static const Names names = [] {
    Names s;
    add(s, kPythonKeywords);
    add(s, kPythonEmitterNames);
    for (const char* t : kPythonTemplates) s.merge(identifiers(template_text(t), Lang::Python, /*after_dot=*/false));
    return s;
  }();
  return names;
}

const std::set<std::string>& python_attribute_reserved() {
  static const Names names = [] {
    Names s;
    add(s, kPythonKeywords);
    add(s, kModuleAttributes);
    s.merge(attribute_names(template_text(kPythonTemplate), {"self"}, /*class_fields=*/false));
    return s;
  }();
  return names;
}

// ---- NameScope ------------------------------------------------------------------------------------
std::string NameScope::spell(std::string_view name) { return plain_spelling(name); }

namespace {
std::string derived_identifier(const std::string& pattern, const std::string& ident) {
  std::string out = pattern;
  return out.replace(out.find("{}"), 2, ident);
}
}  // namespace

std::string NameScope::allocate(const std::string& candidate, const std::vector<std::string>& patterns) {
  auto free = [&](const std::string& name) {
    if (!available(name)) return false;
    for (const std::string& p : patterns)
      if (!available(derived_identifier(p, name))) return false;
    return true;
  };
  std::string name = candidate;
  if (!free(name)) name = candidate + "_";
  for (int k = 2; !free(name); ++k) name = fmt::format("{}_{}", candidate, k);
  taken_.insert(name);
  for (const std::string& p : patterns) taken_.insert(derived_identifier(p, name));
  return name;
}

const std::string& NameScope::get(const std::string& ns, const std::string& name) { return get(ns, name, {}); }

const std::string& NameScope::get(const std::string& ns, const std::string& name, const std::vector<std::string>& patterns) {
  auto key = std::make_pair(ns, name);
  auto it = map_.find(key);
  if (it == map_.end()) it = map_.emplace(key, allocate(spell(name), patterns)).first;
  return it->second;
}

std::string launcher_name(const std::string& kernel) { return "launch_" + kernel; }
std::string workspace_name(const std::string& kernel, const std::string& what) { return kernel + "_" + what; }

std::string NameScope::fresh(const std::string& hint) { return allocate(spell(hint)); }

// ---- C++/CUDA names of the programs ---------------------------------------------------------------
namespace {

const char* const kTensor = "tensor";
const char* const kKernel = "kernel";
const char* const kLoop = "local";

// Identifiers a traversal kernel's registers, rows and loop variables cannot take: C++ keywords, CUDA
// built-ins and macros, the names the printer declares (intra::is_kernel_reserved); the kernel's tensors (its
// parameters) are taken per program.
const std::set<std::string>& kernel_local_reserved() {
  static const Names names = [] {
    Names s;
    add(s, kCppKeywords);
    add(s, kCudaAndMacros);
    add(s, kCppEmitterNames);
    return s;
  }();
  return names;
}

class CppRenamer {
 public:
  explicit CppRenamer(NameScope& names) : n_(names) {}

  // Allocation order decides who keeps a contested spelling: the user's names first, then derived ones.
  void allocate(const std::vector<Program>& phases) {
    const Program& p = phases.front();
    for (const Program& ph : phases) {
      n_.take(ph.model + "_" + ph.phase);  // the torch-free entry points and the host functions
      n_.take(ph.model + "_" + ph.phase + "_op");
      n_.take(ph.model + "_" + ph.phase + "_meta");
    }
    n_.take(p.model + "_ext");
    std::vector<std::string> tensors, derived;
    auto tensor = [&](const std::string& t) { (is_derived_name(t) ? derived : tensors).push_back(t); };
    for (const Program& ph : phases) {
      for (const auto* list : {&ph.decl.inputs, &ph.decl.weights, &ph.decl.outputs})
        for (const TensorDecl& t : *list) tensor(t.name);
      for (const intra::TensorInfo& t : ph.tensors) tensor(t.name);
      for (const auto& [field, holder] : ph.aliases) tensor(field);
      for (const intra::Kernel& k : ph.kernels)
        if (auto* t = std::get_if<intra::TorchInstance>(&k)) fields(t->loop, tensor);
    }
    for (const std::string& t : tensors) n_.get(kTensor, t);
    for (const Program& ph : phases)
      for (const intra::Kernel& k : ph.kernels) kernel(intra::kernel_name(k));
    for (const std::string& t : derived) n_.get(kTensor, t);
  }

  Program rename(const Program& in) {
    Program p = in;
    decl_ = &in.decl;
    for (auto* list : {&p.decl.inputs, &p.decl.weights, &p.decl.outputs})
      for (TensorDecl& t : *list) t.name = tensor(t.name);
    for (intra::TensorInfo& t : p.tensors) t.name = tensor(t.name);
    for (std::string& s : p.saved) s = tensor(s);
    std::map<std::string, std::string> aliases;
    for (const auto& [f, t] : p.aliases) aliases[tensor(f)] = tensor(t);
    p.aliases = aliases;
    for (intra::Kernel& k : p.kernels) {
      std::visit(
          [&](auto& x) {
            using T = std::decay_t<decltype(x)>;
            x.name = kernel(x.name);
            if constexpr (std::is_same_v<T, intra::GemmInstance>) {
              for (std::string* t : {&x.x, &x.w, &x.y, &x.row_scalar}) *t = opt_tensor(*t);
            } else if constexpr (std::is_same_v<T, intra::WeightGradInstance>) {
              for (std::string* t : {&x.x, &x.dy, &x.dw, &x.row_scalar}) *t = opt_tensor(*t);
            } else if constexpr (std::is_same_v<T, intra::SegmentSumInstance>) {
              x.v = tensor(x.v);
              x.dw = tensor(x.dw);
            } else if constexpr (std::is_same_v<T, intra::GatherSumInstance>) {
              x.x = tensor(x.x);
              x.y = tensor(x.y);
              x.scale = opt_tensor(x.scale);
            } else if constexpr (std::is_same_v<T, intra::TraversalInstance>) {
              traversal(p, x);
            } else {
              x.target = opt_tensor(x.target);
              for (auto& [local, tn] : x.materialized) tn = tensor(tn);
              std::map<std::string, std::string> ft;
              for (const auto& [f, tn] : x.field_tensor) ft[tensor(f)] = tensor(tn);
              x.field_tensor = ft;
              x.loop = stmt(x.loop, {});
            }
          },
          k);
    }
    return p;
  }

 private:
  std::string tensor(const std::string& t) { return n_.get(kTensor, t); }
  std::string opt_tensor(const std::string& t) { return t.empty() ? t : tensor(t); }
  // A kernel and its launcher launch_<kernel> are both global functions; its workspaces are named after it.
  std::string kernel(const std::string& name) {
    static const std::vector<std::string> derived = [] {
      std::vector<std::string> v{launcher_name("{}")};
      for (const char* what : kKernelWorkspaces) v.push_back(workspace_name("{}", what));
      for (const char* variant : kKernelVariants) v.push_back(fmt::format("{{}}_{}", variant));
      return v;
    }();
    return n_.get(kKernel, name, derived);
  }

  // A traversal instance: tensors by their identifiers; registers, rows and loop variables keep their names
  // (lower-traversal chose identifiers) unless one is now a tensor's identifier, a macro or a built-in.
  void traversal(const Program& p, intra::TraversalInstance& t) {
    NameScope locals(kernel_local_reserved());
    for (const intra::TensorInfo& x : p.tensors) locals.take(x.name);  // renamed already
    auto local = [&](std::string& n) {
      if (n != "0") n = locals.get(kLoop, n);
    };
    local(t.row);
    std::function<void(std::vector<intra::Instr>&)> block = [&](std::vector<intra::Instr>& body) {
      for (intra::Instr& in : body)
        std::visit(
            [&](auto& x) {
              using T = std::decay_t<decltype(x)>;
              if constexpr (std::is_same_v<T, intra::IndexDef>) {
                local(x.name);
                local(x.of);
              } else if constexpr (std::is_same_v<T, intra::Def>) {
                local(x.name);
                if (auto* l = std::get_if<intra::Load>(&x.source)) {
                  l->tensor = tensor(l->tensor);
                  local(l->row);
                } else if (auto* e = std::get_if<intra::Eval>(&x.source)) {
                  e->value = value(e->value, local);
                } else if (auto* r = std::get_if<intra::Reduce>(&x.source)) {
                  r->value = value(r->value, local);
                }
              } else if constexpr (std::is_same_v<T, intra::Update>) {
                local(x.name);
                x.value = value(x.value, local);
              } else if constexpr (std::is_same_v<T, intra::Store>) {
                x.tensor = tensor(x.tensor);
                local(x.row);
                local(x.reg);
              } else if constexpr (std::is_same_v<T, intra::EdgeLoop>) {
                local(x.var);
                local(x.pos);
                local(x.node);
                block(x.body);
              }
            },
            in.v);
    };
    block(t.body);
  }

  static intra::ValueP value(const intra::ValueP& v, const std::function<void(std::string&)>& local) {
    if (v->kind == intra::Value::Kind::Const) return v;
    if (v->kind == intra::Value::Kind::Reg) {
      std::string n = v->reg;
      local(n);
      return n == v->reg ? v : intra::Value::reg_ref(n);
    }
    std::vector<intra::ValueP> args;
    for (const intra::ValueP& a : v->args) args.push_back(value(a, local));
    return intra::Value::apply(v->op, std::move(args));
  }

  static void fields(const StmtP& s, const std::function<void(const std::string&)>& f) {
    std::function<void(const ExprP&)> expr = [&](const ExprP& e) {
      if (e->kind == ExprKind::Index && e->args[1]->kind == ExprKind::String) f(e->args[1]->name);
      for (const ExprP& a : e->args) expr(a);
    };
    if (s->target) expr(s->target);
    if (s->value) expr(s->value);
    for (const StmtP& b : s->body) fields(b, f);
  }

  bool is_tensor(const std::string& n) const {
    return decl_->find_input(n) || decl_->find_weight(n) || decl_->find_output(n);
  }

  // A PyTorch instance's loop nest: the tensors it names (weights, inputs read as attributes, fields) by
  // their identifiers. `loops`: the loop variables in scope, and whether each is an edge.
  ExprP expr(const ExprP& e, const std::map<std::string, bool>& loops) {
    auto copy = std::make_shared<Expr>(*e);
    for (ExprP& a : copy->args) a = expr(a, loops);
    switch (e->kind) {
      case ExprKind::Name:
        if (!loops.count(e->name) && is_tensor(e->name)) copy->name = tensor(e->name);
        break;  // locals, hyper-parameters, loop variables and the graph keep their names
      case ExprKind::Attr: {
        const ExprP& base = e->args[0];
        bool edge = base->kind == ExprKind::Name && loops.count(base->name) && loops.at(base->name);
        bool graph_attr = e->name == "ntype" || (edge && (e->name == "src" || e->name == "dst" || e->name == "etype"));
        if (!graph_attr && decl_->find_input(e->name)) copy->name = tensor(e->name);
        break;
      }
      case ExprKind::Index:
        if (e->args[1]->kind == ExprKind::String) {
          auto key = std::make_shared<Expr>(*e->args[1]);
          key->name = tensor(key->name);
          copy->args[1] = key;
        }
        break;
      default: break;
    }
    return copy;
  }

  StmtP stmt(const StmtP& s, std::map<std::string, bool> loops) {
    auto copy = std::make_shared<Stmt>(*s);
    if (s->kind == StmtKind::For) {
      loops[s->var] = is_edge_loop(s->loop);
      for (StmtP& b : copy->body) b = stmt(b, loops);
      return copy;
    }
    if (s->target) copy->target = expr(s->target, loops);
    if (s->value) copy->value = expr(s->value, loops);
    return copy;
  }

  NameScope& n_;
  const inter::ModelDecl* decl_ = nullptr;
};

}  // namespace

std::vector<Program> with_cpp_names(const std::vector<Program>& phases) {
  NameScope names(cpp_reserved());
  CppRenamer r(names);
  r.allocate(phases);
  std::vector<Program> out;
  for (const Program& p : phases) out.push_back(r.rename(p));
  return out;
}

// ---- Python ---------------------------------------------------------------------------------------
PythonNames python_names(const inter::ModelDecl& decl) {
  PythonNames out;
  NameScope globals(python_reserved()), attrs(python_attribute_reserved());
  std::string cls = decl.name;
  if (!cls.empty()) cls[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(cls[0])));
  out.model_class = globals.get("class", cls);
  for (const TensorDecl& t : decl.inputs)  // inputs computed from the graph are no parameters
    if (t.from_graph.empty()) {
      out.param[t.name] = globals.get("param", t.name);
      if (t.indexed_rows) out.param[t.name + "_rows"] = globals.get("param", t.name + "_rows");  // its node-to-row map
    }
  for (const TensorDecl& w : decl.weights) {
    out.param[w.name] = globals.get("param", w.name);
    out.attr[w.name] = attrs.get("attr", w.name);
  }
  return out;
}

namespace {

// The parameters of the generated module's constructor (def __init__(self, ...)).
Names constructor_parameters() {
  const std::string& text = template_text(kPythonTemplate);
  size_t at = text.find("def __init__(");
  if (at == std::string::npos) return {};
  size_t end = text.find(')', at);
  std::string params = text.substr(at + 13, end - at - 13);
  Names out;
  size_t i = 0;
  while (i < params.size()) {
    while (i < params.size() && (params[i] == ' ' || params[i] == ',')) ++i;
    bool starred = i < params.size() && params[i] == '*';  // **hyper collects the hyper-parameters themselves
    while (i < params.size() && !ident_start(params[i])) ++i;
    size_t b = i;
    while (i < params.size() && ident_char(params[i])) ++i;
    if (i > b && !starred) out.insert(params.substr(b, i - b));
    while (i < params.size() && params[i] != ',') ++i;  // skip defaults
  }
  return out;
}

}  // namespace

bool check_public_names(const inter::ModelDecl& decl, Diagnostics& diags) {
  int before = diags.error_count();
  const Names keywords(std::begin(kPythonKeywords), std::end(kPythonKeywords));
  const Names modules(std::begin(kPythonModules), std::end(kPythonModules));
  if (keywords.count(decl.name))
    diags.error(decl.loc, "reserved-name",
                fmt::format("model name '{}' is a Python keyword: the generated module {}.py could not be imported",
                            decl.name, decl.name));
  else if (modules.count(decl.name))
    diags.error(decl.loc, "reserved-name",
                fmt::format("model name '{}' is the name of a Python module: the generated {}.py would shadow it", decl.name,
                            decl.name));
  static const Names ctor = constructor_parameters();
  std::string list;
  for (const std::string& c : ctor) list += (list.empty() ? "" : ", ") + c;
  for (const HyperParam& h : decl.hyper)
    if (ctor.count(h.name))
      diags.error(h.loc, "reserved-name",
                  fmt::format("hyper-parameter '{}' has the name of a parameter of the generated module's constructor ({})",
                              h.name, list));
  return diags.error_count() == before;
}

}  // namespace hectorgen::emit
