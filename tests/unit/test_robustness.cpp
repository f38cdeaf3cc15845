// Robustness: the compiler must never crash or report an internal error on malformed input.
//
// Every bundled spec (rgcn.yaml, rgat.yaml, hgt.yaml, rgcn.json) is mutated 200 times with a fixed seed:
// truncation, byte flips / insertions / deletions (NUL, tabs, CR, non-ASCII, quotes, brackets, ':'),
// line deletion / duplication / swap, indentation changes in the program, DSL token replacements,
// changed numbers (0, -1, 1e9, 3.5, ...), DSL statements spliced into the program (these often compile and
// reach lowering and the emitters), and stacks of those: 800 mutants, about 2 s (Release) or 5 s (Debug).
// Each mutant goes through driver::run() in-process; every 12th one also goes through the real binary as
// a subprocess, which catches signals (segfaults, aborts, stack overflows) and hangs. For every mutant:
//   * the exit code is 0 or 1, never 2, and no exception escapes driver::run;
//   * on 1, stderr is non-empty and starts with `<path>:<line>:<col>: error: <message> [<kind>]`, then
//     the quoted source line <line> and a caret at most one column past its end; the position-less form
//     `<path>: error: ... [<kind>]` is accepted only for whole-file kinds (kFileLevelKinds);
//   * on 1, stdout is empty and the output directory (pre-populated) is byte-for-byte unchanged;
//   * on 0, no temporary file is left in the output directory;
//   * the binary's exit code (and, on 1, its stderr) equal driver::run's.
// Unexpected failures are saved under ./robustness-failures/ (the test's working directory, build/tests
// under ctest) with a line each in robustness-failures/failures.txt, for replay with build/hectorgen.
//
// Accepted mutants must also compile. With HECTORGEN_FUZZ_COMPILE_DIR set (the ctest test robustness_fuzz sets
// it), a deterministic sample of the accepted mutants whose generated code differs from the bundled specs' and
// from each other's (HECTORGEN_FUZZ_COMPILE_SAMPLE of them, 8 by default, evenly spread over the run) is written
// there, each as <seed>-<index>-<spec>/{<spec>, mutation.txt, out/}; the next test, robustness_compile
// (tests/compile/compile_mutants.sh), compiles every out/ with nvcc, against torch's headers and with py_compile,
// and saves a mutant whose output does not compile under robustness-failures/ like the failures above.
//
// Known bugs: failures that match an entry of known_issues() are counted and reported (WARN), not failed,
// so that this test guards against new problems while those are open. Each known bug also has a pinned
// reproducer below, tagged [!shouldfail]: it asserts the correct behaviour, so it starts to "fail" once
// the bug is fixed -- then delete its known_issues() entry and the pinned test.
//
// Knobs for longer local runs (the defaults keep ctest deterministic and fast):
//   HECTORGEN_FUZZ_SEED=<n>    another seed            HECTORGEN_FUZZ_COUNT=<n>  mutants per spec
//   HECTORGEN_FUZZ_STRICT=1    known bugs fail too     HECTORGEN_FUZZ_COMPILE_DIR / _SAMPLE  (see above)
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "driver/driver.h"
#include "helpers.h"

using namespace hectorgen;
using namespace hectorgen::test;

namespace {

namespace fs = std::filesystem;

// ---- a small deterministic generator (std distributions differ between standard libraries) ---------
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next() {  // splitmix64
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  size_t below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(next() % n); }
  bool chance(int percent) { return below(100) < static_cast<size_t>(percent); }
  template <class T>
  const T& pick(const std::vector<T>& v) { return v[below(v.size())]; }

 private:
  uint64_t s_;
};

uint64_t env_u64(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 0) : fallback;
}

std::string hex_byte(unsigned char u) {
  static const char* kHex = "0123456789abcdef";
  return std::string("\\x") + kHex[u >> 4] + kHex[u & 15];
}

// For failure messages: control and non-ASCII bytes escaped, cut at `max` bytes.
std::string printable(const std::string& s, size_t max = 60) {
  std::string out;
  for (char c : s.substr(0, max)) {
    unsigned char u = static_cast<unsigned char>(c);
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (u < 0x20 || u >= 0x7f) out += hex_byte(u);
    else out += c;
  }
  return s.size() > max ? out + "..." : out;
}

// ---- mutation operators -------------------------------------------------------------------------
// Bytes and short strings that stress lexers and parsers.
const std::vector<std::string> kNastyBytes = {
    std::string(1, '\0'), "\t", "\r", "\n", " ", "\"", "'", "[", "]", "{", "}", "(", ")", ":", ",", "#", "-",
    "|", ">", "&", "*", "!", "%", "@", "`", "\\", "=", "+", ".", "?", "$", ";",
    "\xff", "\xc3", "\xc3\xa9" /* e acute */, "\xe2\x80\xa8" /* U+2028 */, "\xef\xbb\xbf" /* BOM */, "\x7f",
    "\x01", "\x1b", "\xf0\x9f\x98\x80" /* emoji */};

// DSL and schema tokens: an occurrence of one is replaced by another (or deleted).
const std::vector<std::string> kTokens = {
    "e.etype", "n.ntype", "e.src", "e.dst", "e.src.ntype", "e.dst.feature", "n.feature", "e.norm", "W0", "W",
    "W_k", "W_att", "mu", "w_s", "+=", "-=", "*=", "/=", "=", "[", "]", "(", ")", ":", ",", ".", "*", "/", "+",
    "-", "reshape(", "dot(", "exp(", "concat(", "outer(", "linear(", "sqrt(", "leakyrelu(", "edge_softmax(",
    "g.edges()", "g.dst_nodes()", "g.src_nodes()", "n.incoming_edges()", "n.outgoing_edges()", "for ", " in ",
    "def ", "\"h\"", "\"att\"", "\"msg\"", "\"agg\"", "n[\"h\"]", "e[\"msg\"]", "e[att]", "0.0", "heads", "in_dim",
    "out_dim", "d_k", "negative_slope", "g", "n", "e", "per", "shape", "node", "edge", "etype", "ntype", "none",
    "model", "program", "inputs", "weights", "outputs", "options", "hyper", "vanilla", "fp32", "true", "off",
    "glorot", "from_graph", "requires_grad", "schedule", "gemm", "tile", "|", "- ", "\"", "{", "}"};

const std::vector<std::string> kNumbers = {"0",   "-1",  "1e9", "3.5", "1",  "2",    "65536", "16777217",
                                           "1e400", "-0", "0.0", ".5",  "1e", "0x10", "99999999999999999999",
                                           "-3.5e-9", "nan", "inf", "1_000", "007"};

// DSL statements spliced into programs: the bundled programs' own lines and a few more.
const std::vector<std::string> kStatements = {
    "for n in g.dst_nodes():", "for n in g.src_nodes():", "for e in g.edges():", "for e in n.incoming_edges():",
    "for e in n.outgoing_edges():", "def edge_softmax(g, att):", "def f(g):", "edge_softmax(g, \"att\")",
    "edge_softmax(g, \"msg\")", "f(g)", "n[\"h\"] = n.feature * W0", "n[\"h\"] += e.norm * (e.src.feature * W[e.etype])",
    "n[\"h\"] += e[\"att\"] * e[\"msg\"]", "n[\"h\"] -= e.src.feature * W[e.etype]", "n[\"h\"] *= 2.0",
    "n[\"h\"] /= sqrt(out_dim)", "n[\"h\"] = n[\"h\"] + n.feature * W0", "n[\"h\"] = relu(n.feature * W0)",
    "n[\"h\"] = linear(n.feature, W0)", "n[\"h\"] = concat(n.feature, n.feature)", "n[\"att_sum\"] = 0.0",
    "n[\"att_sum\"] += e[att]", "e[att] = exp(e[att])", "e[att] = e[att] / e.dst[\"att_sum\"]",
    "e[\"att\"] = exp(-e[\"att\"])", "e[\"att\"] = sigmoid(dot(e.src.feature, e.dst.feature))",
    "e[\"z\"] = outer(e.src.feature, e.dst.feature)", "e[\"msg\"] = e.src.feature * W[e.etype] * e.norm",
    "hs = reshape(e.src.feature * W[e.etype], heads, out_dim)", "ht = reshape(e.dst.feature * W[e.etype], heads, out_dim)",
    "hs = tanh(e.src.feature)", "e[\"msg\"] = hs", "e[\"msg\"] = relu(hs)",
    "e[\"att\"] = leakyrelu(dot(hs, w_s[e.etype]) + dot(ht, w_t[e.etype]), negative_slope)",
    "n[\"k\"] = reshape(n.feature * W_k[n.ntype], heads, d_k)", "n[\"q\"] = reshape(n.feature * W_q[n.ntype], heads, d_k)",
    "n[\"v\"] = reshape(n.feature * W_v[n.ntype], heads, d_k)",
    "e[\"att\"] = dot(e.src[\"k\"] * W_att[e.etype], e.dst[\"q\"]) * mu[e.etype] / sqrt(d_k)",
    "e[\"msg\"] = e.src[\"v\"] * W_msg[e.etype]", "n[\"agg\"] += e[\"att\"] * e[\"msg\"]",
    "n[\"h\"] = reshape(n[\"agg\"], heads * d_k) * W_a[n.ntype]", "n[\"h\"] = n[\"agg\"]", "x = 1.0",
    "e[\"w\"] = e.norm * 2.0 - 1.0", "n[\"h\"] += e[\"w\"] * e.src.feature"};

std::vector<std::string> split_lines(const std::string& text) {  // each keeps its '\n'
  std::vector<std::string> lines;
  size_t b = 0;
  while (b < text.size()) {
    size_t e = text.find('\n', b);
    e = e == std::string::npos ? text.size() : e + 1;
    lines.push_back(text.substr(b, e - b));
    b = e;
  }
  return lines;
}

std::string join_lines(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l;
  return s;
}

struct Mutant {
  std::string text;
  std::string what;  // how it was made, for failure messages
};

// Index of the first line of the program (the line after `program:` / `"program":`), or 0 when none.
size_t program_first_line(const std::vector<std::string>& lines) {
  for (size_t i = 0; i < lines.size(); ++i)
    if (lines[i].rfind("program", 0) == 0 || lines[i].find("\"program\"") != std::string::npos) return i + 1;
  return 0;
}

class Mutator {
 public:
  explicit Mutator(Rng& r) : r_(r) {}

  static constexpr int kKinds = 12;

  // Applies mutation `kind` (0 .. kKinds-1; the last one stacks 2-4 random mutations).
  void apply(int kind, Mutant& m) {
    std::string& t = m.text;
    switch (kind) {
      case 0: {  // truncation at a random byte offset
        size_t at = r_.below(t.size() + 1);
        t.resize(at);
        note(m, "truncate@" + std::to_string(at));
        return;
      }
      case 1: {  // byte flip
        if (t.empty()) return;
        size_t at = r_.below(t.size());
        std::string b = r_.chance(70) ? r_.pick(kNastyBytes) : std::string(1, static_cast<char>(r_.below(256)));
        t.replace(at, 1, b);
        note(m, "flip@" + std::to_string(at) + "=" + printable(b));
        return;
      }
      case 2: {  // byte insertion
        size_t at = r_.below(t.size() + 1);
        std::string b = r_.chance(80) ? r_.pick(kNastyBytes) : std::string(1, static_cast<char>(r_.below(256)));
        if (r_.chance(10)) b = std::string(1 + r_.below(8), b.empty() ? ' ' : b[0]);
        t.insert(at, b);
        note(m, "insert@" + std::to_string(at) + "=" + printable(b));
        return;
      }
      case 3: {  // byte deletion (1-8 bytes)
        if (t.empty()) return;
        size_t at = r_.below(t.size());
        size_t n = 1 + (r_.chance(30) ? r_.below(8) : 0);
        t.erase(at, n);
        note(m, "delete@" + std::to_string(at) + "x" + std::to_string(n));
        return;
      }
      case 4:
      case 5:
      case 6: {  // line deletion / duplication / swap
        auto lines = split_lines(t);
        if (lines.empty()) return;
        size_t i = r_.below(lines.size());
        if (kind == 4) {
          lines.erase(lines.begin() + static_cast<long>(i));
          note(m, "delete-line " + std::to_string(i + 1));
        } else if (kind == 5) {
          lines.insert(lines.begin() + static_cast<long>(i), lines[i]);
          note(m, "dup-line " + std::to_string(i + 1));
        } else {
          size_t j = r_.chance(60) ? std::min(i + 1, lines.size() - 1) : r_.below(lines.size());
          std::swap(lines[i], lines[j]);
          note(m, "swap-lines " + std::to_string(i + 1) + "," + std::to_string(j + 1));
        }
        t = join_lines(lines);
        return;
      }
      case 7: {  // indentation change in the program
        auto lines = split_lines(t);
        size_t first = program_first_line(lines);
        if (first == 0 || first >= lines.size()) return apply(1, m);
        size_t i = first + r_.below(lines.size() - first);
        std::string& l = lines[i];
        size_t ws = l.find_first_not_of(" \t");
        if (ws == std::string::npos) ws = l.size();
        static const char* kEdits[] = {"+1", "+2", "+4", "-1", "-2", "-4", "tab", "zero", "+tab"};
        std::string edit = kEdits[r_.below(std::size(kEdits))];
        // In the JSON spec the program lines sit inside strings: indent inside the quotes too.
        size_t at = ws;
        if (at < l.size() && l[at] == '"') {
          ++at;
          ws = l.find_first_not_of(" \t", at);
          if (ws == std::string::npos) ws = l.size();
        }
        std::string lead = l.substr(at, ws - at);
        if (edit[0] == '+' && edit != "+tab") lead += std::string(std::stoul(edit.substr(1)), ' ');
        else if (edit[0] == '-') lead.erase(0, std::min(lead.size(), static_cast<size_t>(std::stoul(edit.substr(1)))));
        else if (edit == "tab") lead = lead.empty() ? "\t" : "\t" + lead.substr(std::min<size_t>(lead.size(), 4));
        else if (edit == "+tab") lead += "\t";
        else lead.clear();
        l = l.substr(0, at) + lead + l.substr(ws);
        t = join_lines(lines);
        note(m, "indent line " + std::to_string(i + 1) + " " + edit);
        return;
      }
      case 8: {  // token replacement
        for (int tries = 0; tries < 30; ++tries) {
          const std::string& from = r_.pick(kTokens);
          std::vector<size_t> at;
          for (size_t p = t.find(from); p != std::string::npos; p = t.find(from, p + 1)) at.push_back(p);
          if (at.empty()) continue;
          size_t p = r_.pick(at);
          std::string to = r_.chance(90) ? r_.pick(kTokens) : "";
          t.replace(p, from.size(), to);
          note(m, "token@" + std::to_string(p) + " '" + printable(from) + "'->'" + printable(to) + "'");
          return;
        }
        return apply(1, m);
      }
      case 9: {  // number change
        std::vector<std::pair<size_t, size_t>> nums;
        for (size_t p = 0; p < t.size();) {
          if (!std::isdigit(static_cast<unsigned char>(t[p]))) { ++p; continue; }
          size_t b = p;
          while (p < t.size() && (std::isdigit(static_cast<unsigned char>(t[p])) || t[p] == '.')) ++p;
          nums.push_back({b, p - b});
        }
        if (nums.empty()) return apply(1, m);
        auto [b, n] = r_.pick(nums);
        const std::string& to = r_.pick(kNumbers);
        note(m, "number@" + std::to_string(b) + " '" + t.substr(b, n) + "'->'" + to + "'");
        t.replace(b, n, to);
        return;
      }
      case 10: {  // splice a DSL statement (often valid: reaches the verifier, lowering and emitters)
        auto lines = split_lines(t);
        size_t first = program_first_line(lines);
        if (first == 0 || first >= lines.size()) return apply(8, m);
        size_t i = first + r_.below(lines.size() - first);
        const std::string& target = lines[i];
        size_t lead_end = target.find_first_not_of(" \t");
        if (lead_end == std::string::npos) lead_end = 0;
        bool json = lead_end < target.size() && target[lead_end] == '"';
        size_t indent_begin = json ? lead_end + 1 : 0;
        size_t indent_end = target.find_first_not_of(" \t", indent_begin);
        if (indent_end == std::string::npos) indent_end = indent_begin;
        std::string indent = target.substr(indent_begin, indent_end - indent_begin);
        if (r_.chance(20)) indent += "    ";
        std::string stmt = r_.pick(kStatements);
        if (json) {
          std::string escaped;
          for (char c : stmt) escaped += c == '"' ? std::string("\\\"") : std::string(1, c);
          stmt = target.substr(0, lead_end) + "\"" + indent + escaped + "\",\n";
        } else {
          stmt = indent + stmt + "\n";
        }
        bool insert = r_.chance(50);
        if (insert) lines.insert(lines.begin() + static_cast<long>(i), stmt);
        else lines[i] = stmt;
        t = join_lines(lines);
        note(m, std::string(insert ? "insert" : "replace") + " line " + std::to_string(i + 1) + " '" + printable(stmt) + "'");
        return;
      }
      default: {  // a stack of 2-4 mutations
        int n = 2 + static_cast<int>(r_.below(3));
        for (int i = 0; i < n; ++i) apply(static_cast<int>(r_.below(kKinds - 1)), m);
        return;
      }
    }
  }

 private:
  static void note(Mutant& m, const std::string& s) { m.what += (m.what.empty() ? "" : " + ") + s; }
  Rng& r_;
};

// ---- checking one run ---------------------------------------------------------------------------
// Snapshot of a directory tree: relative path -> content ("<dir>" for directories).
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> files;
  std::error_code ec;
  if (!fs::exists(dir, ec)) return files;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    std::string rel = fs::relative(it->path(), dir, ec).string();
    files[rel] = it->is_directory(ec) ? "<dir>" : read_file(it->path().string());
  }
  return files;
}

// Prepares `dir` with content that a failing run must leave alone (including a stale output file).
void populate(const fs::path& dir, const std::string& model_file) {
  fs::remove_all(dir);
  fs::create_directories(dir / "sub");
  std::ofstream(dir / model_file, std::ios::binary) << "stale output from an earlier run\n";
  std::ofstream(dir / "keep.txt", std::ios::binary) << "keep me\n";
  std::ofstream(dir / "sub" / ".hidden", std::ios::binary) << "x";
}

// Lines of `text` as SourceFile sees them (a final newline does not start another line).
std::vector<std::string> source_lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t b = 0;
  do {
    size_t e = text.find('\n', b);
    if (e == std::string::npos) e = text.size();
    std::string l = text.substr(b, e - b);
    if (!l.empty() && l.back() == '\r') l.pop_back();
    lines.push_back(l);
    b = e + 1;
  } while (b < text.size());
  return lines;
}

// The gutter Diagnostics::format puts before a quoted source line.
std::string gutter(long line) {
  std::string n = std::to_string(line);
  return std::string(n.size() < 5 ? 5 - n.size() : 0, ' ') + n + " | ";
}

// Diagnostic kinds about the whole file that may come without a position.
const std::set<std::string> kFileLevelKinds = {"missing-field", "wrong-type", "yaml-syntax", "json-syntax"};

bool is_kind(const std::string& k) {
  return !k.empty() && std::all_of(k.begin(), k.end(), [](char c) { return (c >= 'a' && c <= 'z') || c == '-'; });
}

bool has_control_chars(const std::string& s) {
  return std::any_of(s.begin(), s.end(), [](char c) {
    return (static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7f;
  });
}

// The parts of a diagnostic header after the path: `:<line>:<col>: error: <message> [<kind>]`, or
// `: error: <message> [<kind>]` (line = col = 0). No regex: libstdc++'s recursive matcher can overflow
// the stack on long lines.
struct Header {
  long line = 0, col = 0;
  std::string message, kind;
};

std::optional<Header> parse_header(const std::string& rest) {
  Header h;
  size_t p = 0;
  auto number = [&](long& out) {
    size_t b = p;
    while (p < rest.size() && std::isdigit(static_cast<unsigned char>(rest[p]))) ++p;
    if (p == b || p - b > 9) return false;
    out = std::stol(rest.substr(b, p - b));
    return true;
  };
  if (rest.compare(0, 1, ":") != 0) return std::nullopt;
  if (rest.compare(0, 9, ": error: ") != 0) {
    ++p;
    if (!number(h.line) || rest.compare(p, 1, ":") != 0) return std::nullopt;
    ++p;
    if (!number(h.col) || rest.compare(p, 9, ": error: ") != 0) return std::nullopt;
  }
  p += 9;
  if (rest.empty() || rest.back() != ']') return std::nullopt;
  size_t open = rest.rfind(" [");
  if (open == std::string::npos || open <= p) return std::nullopt;
  h.kind = rest.substr(open + 2, rest.size() - open - 3);
  h.message = rest.substr(p, open - p);
  if (!is_kind(h.kind) || h.message.empty()) return std::nullopt;
  return h;
}

// True when `quoted` is `gutter` + `src` as Diagnostics::format shows it: byte for byte, except that control
// bytes (but tabs) and bytes of non-ASCII characters may each be shown as '?', and no control byte is left.
bool quotes_line(const std::string& quoted, const std::string& gutter, const std::string& src) {
  if (quoted.size() != gutter.size() + src.size() || quoted.compare(0, gutter.size(), gutter) != 0) return false;
  for (size_t i = 0; i < src.size(); ++i) {
    char q = quoted[gutter.size() + i], c = src[i];
    unsigned char u = static_cast<unsigned char>(c);
    bool replaceable = (u < 0x20 && c != '\t') || u >= 0x7f;
    if (q != c && !(q == '?' && replaceable)) return false;
  }
  return !has_control_chars(quoted);
}

// Checks the rendered diagnostics of a failed run; returns a description of the problem or "".
std::string check_stderr(const std::string& err, const std::string& path, const std::string& text) {
  if (err.empty()) return "exit code 1 with empty stderr";
  size_t nl = err.find('\n');
  if (nl == std::string::npos) return "stderr does not end its first line";
  std::string first = err.substr(0, nl);
  if (first.rfind(path, 0) != 0) return "first line does not start with the spec path: " + printable(first, 200);
  std::optional<Header> h = parse_header(first.substr(path.size()));
  if (!h || has_control_chars(h->message)) return "malformed first line: " + printable(first, 200);
  if (h->line == 0) {
    if (!kFileLevelKinds.count(h->kind)) return "diagnostic without a position: " + printable(first, 200);
    return "";
  }
  // The quoted source line and the caret.
  std::vector<std::string> lines = source_lines(text);
  const long line = h->line, col = h->col;
  if (line < 1 || line > static_cast<long>(lines.size()))
    return "line " + std::to_string(line) + " is outside the file (" + std::to_string(lines.size()) +
           " lines): " + printable(first, 200);
  const std::string& src = lines[line - 1];
  if (!quotes_line(err.substr(nl + 1, err.find('\n', nl + 1) - nl - 1), gutter(line), src))
    return "the quoted source is not line " + std::to_string(line) + " of the file";
  if (col < 1 || col > static_cast<long>(src.size()) + 1)
    return "column " + std::to_string(col) + " is outside line " + std::to_string(line) + " (" +
           std::to_string(src.size()) + " characters): " + printable(first, 200);
  // Later diagnostics must name the file too (a SourceLoc without a file renders as "hectorgen: error:").
  for (size_t b = 0; b < err.size();) {
    size_t e = err.find('\n', b);
    if (e == std::string::npos) e = err.size();
    if (err.compare(b, 17, "hectorgen: error:") == 0 || err.compare(b, 19, "hectorgen: warning:") == 0)
      return "a diagnostic without a file: " + printable(err.substr(b, e - b), 200);
    b = e + 1;
  }
  return "";
}

struct Outcome {
  int code = 0;
  std::string out, err;
};

Outcome run_in_process(const std::string& spec, const std::string& out_dir) {
  driver::Options o;
  o.spec_path = spec;
  o.out_dir = out_dir;
  o.verify_each = true;  // the verifier re-checks the typed IR after every pass (any difference: exit 2)
  std::ostringstream out, err;
  Outcome r;
  try {
    r.code = driver::run(o, out, err);
  } catch (const std::exception& e) {  // main() turns these into exit code 2
    err << "<exception escaped driver::run: " << e.what() << ">\n";
    r.code = 2;
  } catch (...) {
    err << "<unknown exception escaped driver::run>\n";
    r.code = 2;
  }
  r.out = out.str();
  r.err = err.str();
  return r;
}

// Runs the real binary. `signal` is set when it died of one; a 20 s alarm turns a hang into SIGALRM.
struct ProcOutcome {
  int code = -1;
  int signal = 0;
  std::string err;
  bool exec_failed = false;
};

ProcOutcome run_subprocess(const std::vector<std::string>& args, const fs::path& scratch) {
  const std::string err_path = (scratch / "stderr.txt").string();
  const std::string out_path = (scratch / "stdout.txt").string();
  ProcOutcome r;
  // Retried a few times when the binary cannot be executed (e.g. relinked by a concurrent build).
  for (int attempt = 0; attempt < 5; ++attempt) {
    pid_t pid = ::fork();
    if (pid == 0) {
      int e = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int o = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (e < 0 || o < 0) ::_exit(126);
      ::dup2(o, 1);
      ::dup2(e, 2);
      ::alarm(20);
      std::vector<char*> argv;
      argv.push_back(const_cast<char*>(HECTORGEN_BINARY));
      for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(HECTORGEN_BINARY, argv.data());
      const char msg[] = "<exec failed>";
      [[maybe_unused]] ssize_t w = ::write(2, msg, sizeof msg - 1);
      ::_exit(127);
    }
    int status = 0;
    if (pid < 0 || ::waitpid(pid, &status, 0) != pid) return r;
    r = ProcOutcome{};
    if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
    if (WIFEXITED(status)) r.code = WEXITSTATUS(status);
    r.err = read_file(err_path);
    r.exec_failed = r.code == 127 && r.err == "<exec failed>";
    if (!r.exec_failed) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  return r;
}

// ---- known bugs (see the header comment) ----------------------------------------------------------
struct KnownIssue {
  const char* id;
  const char* summary;
  std::function<bool(int code, const std::string& err, const std::string& path)> matches;
};

// None open at present. An entry: {"id", "summary: what goes wrong, where", [](int code, const std::string& err,
// const std::string& path) { return <whether this failure is that bug>; }}, plus a pinned [!shouldfail] test.
const std::vector<KnownIssue>& known_issues() {
  static const std::vector<KnownIssue> issues = {};
  return issues;
}

const KnownIssue* known_issue(int code, const std::string& err, const std::string& path) {
  if (env_u64("HECTORGEN_FUZZ_STRICT", 0)) return nullptr;
  for (const KnownIssue& k : known_issues())
    if (k.matches(code, err, path)) return &k;
  return nullptr;
}

// Saves a failing input and appends its description to robustness-failures/failures.txt.
void save_failure(const std::string& name, const std::string& text, const std::string& description) {
  std::error_code ec;
  fs::create_directories("robustness-failures", ec);
  std::ofstream(fs::path("robustness-failures") / name, std::ios::binary) << text;
  std::ofstream(fs::path("robustness-failures") / "failures.txt", std::ios::app) << description << "\n";
}

// A scratch folder under the system temp directory, removed at the end of the test.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag)
      : path(fs::temp_directory_path() / ("hectorgen-" + tag + "-" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// The generated code of a successful run (the files that the compile check compiles), for telling apart
// mutants that change the generated code from those that only change, e.g., spaces or comments.
std::string generated_code(const fs::path& out) {
  std::string code;
  for (const auto& [file, content] : snapshot(out)) {
    std::string ext = fs::path(file).extension().string();
    if (ext == ".cu" || ext == ".h" || ext == ".cpp" || ext == ".py") code += file + '\0' + content + '\0';
  }
  return code;
}

// An accepted mutant whose generated code no earlier run produced.
struct Accepted {
  std::string spec_name;  // e.g. rgat.yaml
  size_t index = 0;
  Mutant mutant;
};

// Writes `sample` evenly spread picks of `accepted` under `dir` (removed first) as <seed>-<index>-<spec>/ with
// the mutant spec, mutation.txt (how it was made) and out/ (hectorgen's output). Returns how many it wrote.
size_t write_compile_sample(const fs::path& dir, uint64_t seed, const std::vector<Accepted>& accepted, size_t sample) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  const size_t n = std::min(sample, accepted.size());
  size_t written = 0;
  for (size_t k = 0; k < n; ++k) {
    const Accepted& a = accepted[k * accepted.size() / n];
    const fs::path case_dir = dir / (std::to_string(seed) + "-" + std::to_string(a.index) + "-" + a.spec_name);
    fs::create_directories(case_dir);
    std::ofstream(case_dir / a.spec_name, std::ios::binary) << a.mutant.text;
    std::ofstream(case_dir / "mutation.txt", std::ios::binary) << a.spec_name << " #" << a.index << " [" << a.mutant.what << "]\n";
    Outcome r = run_in_process((case_dir / a.spec_name).string(), (case_dir / "out").string());
    INFO(a.spec_name << " #" << a.index << ": " << printable(r.err, 300));
    CHECK(r.code == 0);  // accepted once, so accepted again
    written += r.code == 0;
  }
  return written;
}

}  // namespace

TEST_CASE("mutated specs never crash and fail with a well-formed diagnostic", "[robustness][fuzz]") {
  const uint64_t seed = env_u64("HECTORGEN_FUZZ_SEED", 20240611);
  const size_t per_spec = env_u64("HECTORGEN_FUZZ_COUNT", 200);
  const size_t subprocess_every = 12;
  const char* compile_dir = std::getenv("HECTORGEN_FUZZ_COMPILE_DIR");
  const size_t compile_sample = env_u64("HECTORGEN_FUZZ_COMPILE_SAMPLE", 8);

  TempDir tmp("robustness");
  fs::create_directories(tmp.path / "in");
  const fs::path out = tmp.path / "out";

  auto started = std::chrono::steady_clock::now();
  size_t runs = 0, rejected = 0, subprocess_runs = 0, positionless = 0;
  std::map<int, size_t> codes;
  std::map<std::string, std::pair<size_t, std::string>> known_hits;  // id -> count, first example
  std::vector<std::string> failures;
  std::set<std::string> seen_code;  // the generated code of the bundled specs and of the accepted mutants so far
  std::vector<Accepted> accepted;   // the accepted mutants that generated new code, in order

  const char* specs[] = {"rgcn.yaml", "rgat.yaml", "hgt.yaml", "rgcn.json"};
  for (size_t si = 0; si < std::size(specs); ++si) {
    const std::string name = specs[si];
    const std::string original = read_file(spec_path(name));
    REQUIRE_FALSE(original.empty());
    {
      const std::string spec = (tmp.path / "in" / name).string();
      std::ofstream(spec, std::ios::binary | std::ios::trunc) << original;
      fs::remove_all(out);
      REQUIRE(run_in_process(spec, out.string()).code == 0);
      seen_code.insert(generated_code(out));
    }
    Rng rng(seed * 1000003u + si);
    Mutator mutator(rng);
    const std::string model = name.substr(0, name.find('.'));
    const std::string spec = (tmp.path / "in" / name).string();
    for (size_t i = 0; i < per_spec; ++i) {
      Mutant m{original, ""};
      mutator.apply(static_cast<int>(i % Mutator::kKinds), m);
      std::ofstream(spec, std::ios::binary | std::ios::trunc) << m.text;
      populate(out, model + ".inter.ir");
      const auto before = snapshot(out);

      Outcome r = run_in_process(spec, out.string());
      ++runs;
      ++codes[r.code];
      std::string problem;
      const KnownIssue* known = nullptr;
      if (r.code != 0 && r.code != 1) {
        problem = "exit code " + std::to_string(r.code) + ": " + printable(r.err, 300);
      } else if (r.code == 1) {
        ++rejected;
        problem = check_stderr(r.err, spec, m.text);
        if (problem.empty() && r.err.compare(spec.size(), 8, ": error:") == 0) ++positionless;
        if (problem.empty() && snapshot(out) != before) problem = "the output directory changed on failure";
        if (problem.empty() && !r.out.empty()) problem = "stdout is not empty on failure";
      } else {
        for (const auto& [file, _] : snapshot(out))
          if (file.find(".tmp") != std::string::npos) problem = "a temporary file was left behind: " + file;
        if (problem.empty() && seen_code.insert(generated_code(out)).second) accepted.push_back({name, i, m});
      }
      if (!problem.empty()) known = known_issue(r.code, r.err, spec);

      if (problem.empty() && i % subprocess_every == 0) {
        populate(out, model + ".inter.ir");
        ProcOutcome p = run_subprocess({spec, "-o", out.string()}, tmp.path);
        ++subprocess_runs;
        if (p.exec_failed) problem = std::string("cannot execute ") + HECTORGEN_BINARY;
        else if (p.signal) problem = "the binary died of signal " + std::to_string(p.signal) + " (" + strsignal(p.signal) + ")";
        else if (p.code != r.code)
          problem = "the binary exited with " + std::to_string(p.code) + ", driver::run returned " +
                    std::to_string(r.code) + ": " + printable(p.err, 300);
        else if (p.code == 1 && p.err != r.err) problem = "the binary's stderr differs from driver::run's";
        else if (p.code == 1 && snapshot(out) != before) problem = "the binary changed the output directory on failure";
      }

      if (problem.empty()) continue;
      std::string description = name + " #" + std::to_string(i) + " [" + m.what + "]: " + problem;
      if (known) {
        auto& [count, example] = known_hits[known->id];
        if (count++ == 0) example = description;
        continue;
      }
      std::string saved = std::to_string(seed) + "-" + std::to_string(i) + "-" + name;
      failures.push_back(description + " (input saved as robustness-failures/" + saved + ")");
      save_failure(saved, m.text, failures.back());
    }
  }

  size_t sampled = 0;
  if (compile_dir && *compile_dir) sampled = write_compile_sample(compile_dir, seed, accepted, compile_sample);

  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::ostringstream summary;
  summary << runs << " mutants (seed " << seed << "): " << codes[0] << " accepted (" << accepted.size()
          << " with new generated code), " << rejected << " rejected (" << positionless << " without a position), "
          << codes[2] << " internal errors; " << subprocess_runs << " also through the binary; " << secs << " s";
  if (compile_dir && *compile_dir) summary << "\n" << sampled << " accepted mutants written to " << compile_dir << " to compile";
  for (const auto& [id, hit] : known_hits)
    summary << "\nknown bug '" << id << "' hit " << hit.first << " time(s), e.g. " << hit.second;
  WARN(summary.str());
  CHECK(runs >= 600);
  CHECK(subprocess_runs >= 50);
  if (compile_dir && *compile_dir) {
    // A full sample: enough accepted mutants with new generated code (a mutator gone useless fails here).
    CHECK(accepted.size() >= compile_sample);
    CHECK(sampled == compile_sample);
  }
  for (const std::string& f : failures) FAIL_CHECK(f);
  CHECK(failures.empty());
}

// ---- reproducers of fixed bugs (once pinned as known bugs) -----------------------------------------
namespace {

struct Run {
  int code = -1;
  int signal = 0;
  std::string err;
  std::string out_dir;
};

// Runs `text` (written as `file_name`) in-process and checks exit code 0/1 and, on 1, the diagnostic.
Run check_well_behaved(const std::string& file_name, const std::string& text) {
  TempDir tmp("fixed-bug");
  const std::string spec = (tmp.path / file_name).string();
  std::ofstream(spec, std::ios::binary) << text;
  Outcome r = run_in_process(spec, (tmp.path / "out").string());
  INFO(printable(r.err, 600));
  CHECK((r.code == 0 || r.code == 1));
  if (r.code == 1) CHECK(check_stderr(r.err, spec, text) == "");
  // Relative to the spec: "<line>:<col>: error: ..." (the temporary folder's path left out).
  return {r.code, 0, r.code == 1 ? r.err.substr(spec.size() + 1) : r.err, ""};
}

// Runs `text` through the binary and checks that it exits with 0 or 1 (no signal, no internal error).
Run check_no_crash(const std::string& file_name, const std::string& text) {
  TempDir tmp("fixed-bug");
  const std::string spec = (tmp.path / file_name).string();
  std::ofstream(spec, std::ios::binary) << text;
  ProcOutcome p = run_subprocess({spec, "-o", (tmp.path / "out").string()}, tmp.path);
  INFO(file_name << ": signal " << p.signal << ", exit code " << p.code << ", stderr: " << printable(p.err, 300));
  CHECK(p.signal == 0);
  CHECK((p.code == 0 || p.code == 1));
  if (p.code == 1) CHECK(check_stderr(p.err, spec, text) == "");
  return {p.code, p.signal, p.code == 1 && p.err.size() > spec.size() ? p.err.substr(spec.size() + 1) : p.err, ""};
}

std::string spec_text(const std::string& name) { return read_file(spec_path(name)); }

std::string repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

}  // namespace

TEST_CASE("a JSON number out of range is a positioned json-syntax error", "[robustness]") {
  Run r = check_well_behaved("overflow.json", replace(spec_text("rgcn.json"), "\"in_dim\": 64", "\"in_dim\": 1e400"));
  CHECK(r.code == 1);
  CHECK(starts_with(r.err, "4:23: error: number 1e400 is out of range (JSON numbers must fit in a double) [json-syntax]\n"));
}

TEST_CASE("a name with invalid UTF-8 is a bad-name error, a reserved name a reserved-name error", "[robustness]") {
  std::string text = replace(spec_text("rgcn.yaml"), "  h: {per: node", "  h\xff: {per: node");
  text = replace(replace(text, "n[\"h\"] = n.feature", "n[\"h\xff\"] = n.feature"), "n[\"h\"] +=", "n[\"h\xff\"] +=");
  Run r = check_well_behaved("utf8.yaml", text);
  CHECK(r.code == 1);
  CHECK(starts_with(r.err, "16:3: error: output 'h\\xff' is not an identifier ([A-Za-z_][A-Za-z0-9_]*) [bad-name]\n"));

  struct Case {
    const char* from;
    const char* to;
    const char* header;
  };
  const Case rejected[] = {
      {"  in_dim: 64\n", "  in_dim: 64\n  def: 64\n", "7:3: error: hyper-parameter 'def' is a keyword of the model language"},
      {"model: rgcn", "model: return", "4:1: error: model name 'return' is a Python keyword"},
      {"model: rgcn", "model: __x", "4:8: error: model name '__x' is reserved"},
      {"n[\"h\"] = n.feature * W0", "n[\"d$h\"] = n.feature * W0", "23:9: error: field name 'd$h' is reserved"},
      {"n[\"h\"] = n.feature * W0", "n[\"src\"] = n.feature * W0", "23:9: error: field name 'src' is an attribute"},
  };
  for (const Case& k : rejected) {
    CAPTURE(k.to);
    Run c = check_well_behaved("names.yaml", replace(spec_text("rgcn.yaml"), k.from, k.to));
    CHECK(c.code == 1);
    CHECK(starts_with(c.err, k.header));
    CHECK(c.err.find("[reserved-name]\n") != std::string::npos);
  }
  // Keywords of C++, CUDA and Python are fine where the model language allows them: the emitters mangle them.
  const std::pair<const char*, const char*> accepted[] = {
      {"  W0: {per: none", "  int: {per: none"},
      {"  feature: {per: node", "  lambda: {per: node"},
      {"n[\"h\"] = n.feature * W0", "n[\"class\"] = n.feature * W0\n      n[\"h\"] = n[\"class\"]"},
      {"n[\"h\"] = n.feature * W0", "float = n.feature * W0\n      n[\"h\"] = float"},
      {"for e in n.incoming_edges():\n          n[\"h\"] += e.norm * (e.src.feature * W[e.etype])",
       "for threadIdx in n.incoming_edges():\n          n[\"h\"] += threadIdx.norm * (threadIdx.src.feature * W[threadIdx.etype])"},
  };
  for (const auto& [from, to] : accepted) {
    CAPTURE(to);
    std::string t = replace(spec_text("rgcn.yaml"), from, to);
    if (std::string(to).find("int:") != std::string::npos) t = replace(t, "n.feature * W0", "n.feature * int");
    if (std::string(to).find("lambda:") != std::string::npos) t = replace(replace(t, "n.feature * W0", "n.lambda * W0"), "e.src.feature", "e.src.lambda");
    Run c = check_well_behaved("names.yaml", t);
    INFO(c.err);
    CHECK(c.code == 0);
  }
}

TEST_CASE("dot() with 32 or more outputs is generated (each lane keeps the outputs it owns)", "[robustness]") {
  for (const char* heads : {"32", "40"}) {
    CAPTURE(heads);
    std::string text = replace(spec_text("rgat.yaml"), "  heads: 1\n", std::string("  heads: ") + heads + "\n");
    text = replace(text, "  out_dim: 64\n", "  out_dim: 3\n");
    TempDir tmp("dot-rows");
    const std::string spec = (tmp.path / "heads.yaml").string();
    std::ofstream(spec, std::ios::binary) << text;
    Outcome r = run_in_process(spec, (tmp.path / "out").string());
    INFO(r.err);
    REQUIRE(r.code == 0);
    std::string cu = read_file((tmp.path / "out" / "rgat_kernels.cu").string());
    // 32 x 3 or 40 x 3 elements a row: auto gives the attention kernels 16 lanes a row (8 would take 12 or 15
    // slots a lane, more than 8). The 32 or 40 outputs take 2 or 3 slots a lane: runs of 2 (elements 2 l, 2 l + 1 in
    // lane l) or, 3 being odd, interleaved (element l + 16 j).
    const std::string owner = std::string(heads) == "32" ? "m / 2 % 16" : "m % 16";
    CHECK(cu.find("kept by lane " + owner) != std::string::npos);
    CHECK(cu.find("if (lane == " + owner + ")") != std::string::npos);
  }
}

TEST_CASE("control characters from the spec are escaped in the diagnostic header", "[robustness]") {
  Run r = check_well_behaved("cr.yaml", replace(spec_text("rgcn.yaml"), "model: rgcn", "model: \"rg\\rcn\""));
  CHECK(r.code == 1);
  CHECK(starts_with(r.err, "4:8: error: model name 'rg\\rcn' is not an identifier"));

  // Raw bytes: the message escapes them, the quoted line shows '?' (one per byte, so the caret still lines up).
  Run raw = check_well_behaved("esc.yaml", replace(spec_text("rgcn.yaml"), "model: rgcn", "model: rg\x1b[2J\x7f\x01" "cn"));
  CHECK(raw.code == 1);
  CHECK(starts_with(raw.err, "4:8: error: model name 'rg\\x1b[2J\\x7f\\x01cn' is not an identifier"));
  CHECK(raw.err.find("    4 | model: rg?[2J??cn\n") != std::string::npos);
}

TEST_CASE("deeply nested DSL expressions are a too-deep error, not a stack overflow", "[robustness]") {
  Run r = check_no_crash("parens.yaml", replace(spec_text("rgcn.yaml"), "n[\"h\"] = n.feature * W0",
                                                "n[\"h\"] = " + repeat("(", 100000) + "n.feature" + repeat(")", 100000) + " * W0"));
  CHECK(r.code == 1);
  CHECK(starts_with(r.err, "23:271: error: nested too deeply (more than 256 levels"));
  Run neg = check_no_crash("neg.yaml", replace(spec_text("rgcn.yaml"), "n[\"h\"] = n.feature * W0",
                                               "n[\"h\"] = " + repeat("-", 100000) + "n.feature * W0"));
  CHECK(neg.code == 1);
  CHECK(neg.err.find("[too-deep]") != std::string::npos);
  Run idx = check_no_crash("index.yaml", replace(spec_text("rgcn.yaml"), "n[\"h\"] = n.feature * W0",
                                                 "n[\"h\"] = n.feature * W0" + repeat("[e.etype]", 5000)));
  CHECK(idx.code == 1);
  CHECK(idx.err.find("[too-deep]") != std::string::npos);
}

TEST_CASE("deeply nested blocks are a too-deep error", "[robustness]") {
  std::string program;
  for (int i = 0; i < 2000; ++i) program += "  " + std::string(2 * i, ' ') + "for n in g.dst_nodes():\n";
  program += "  " + std::string(2 * 2000, ' ') + "n[\"h\"] = n.feature * W0\n";
  std::string text = spec_text("rgcn.yaml");
  text = text.substr(0, text.find("program: |\n")) + "program: |\n" + program;
  Run r = check_no_crash("blocks.yaml", text);
  CHECK(r.code == 1);
  CHECK(r.err.find("nested too deeply") != std::string::npos);
}

TEST_CASE("a long sum is a too-deep error, not a stack overflow in the verifier", "[robustness]") {
  Run r = check_no_crash("sum.yaml", replace(spec_text("rgcn.yaml"), "n[\"h\"] = n.feature * W0",
                                             "n[\"h\"] = n.feature * W0" + repeat(" + n.feature * W0", 30000)));
  CHECK(r.code == 1);
  CHECK(r.err.find("expression too long or too deeply nested (more than 1000 levels)") != std::string::npos);
  // Just under the limit (about 1000 levels), the whole pipeline (verifier, autodiff, lowering, emitters) runs.
  Run ok = check_no_crash("sum_ok.yaml", replace(spec_text("rgcn.yaml"), "n[\"h\"] = n.feature * W0",
                                                 "n[\"h\"] = n.feature" + repeat(" + n.feature", 990) + " * W0"));
  CHECK(ok.code == 0);
}

TEST_CASE("a long constant expression is a too-deep error, not a stack overflow in eval_constant", "[robustness]") {
  Run r = check_no_crash("hyper.yaml", replace(spec_text("rgcn.yaml"), "  in_dim: 64", "  in_dim: " + repeat("1+", 100000) + "63"));
  CHECK(r.code == 1);
  CHECK(r.err.find("[too-deep]") != std::string::npos);
}

TEST_CASE("a deep chain of function calls is a too-deep error, not a stack overflow in the inliner", "[robustness]") {
  const int n = 30000;
  std::string defs;
  for (int i = 0; i < n; ++i) defs += "  def f" + std::to_string(i) + "(g):\n      f" + std::to_string(i + 1) + "(g)\n";
  defs += "  def f" + std::to_string(n) + "(g):\n      for e in g.edges():\n          e[\"x\"] = 1.0\n";
  std::string text = replace(spec_text("rgcn.yaml"), "program: |\n", "program: |\n" + defs + "  f0(g)\n");
  Run r = check_no_crash("calls.yaml", text);
  CHECK(r.code == 1);
  CHECK(r.err.find("function calls nested too deeply (more than 64 levels) at this call of 'f64' [too-deep]") !=
        std::string::npos);

  // Each function calling the next one twice: 2^40 expansions, stopped by the budget.
  std::string fan;
  for (int i = 0; i < 40; ++i)
    fan += "  def f" + std::to_string(i) + "(g):\n      f" + std::to_string(i + 1) + "(g)\n      f" + std::to_string(i + 1) + "(g)\n";
  fan += "  def f40(g):\n      for e in g.edges():\n          e[\"x\"] = 1.0\n";
  Run wide = check_no_crash("fan.yaml", replace(spec_text("rgcn.yaml"), "program: |\n", "program: |\n" + fan + "  f0(g)\n"));
  CHECK(wide.code == 1);
  CHECK(wide.err.find("too many function calls to inline") != std::string::npos);
}

TEST_CASE("deeply nested YAML and JSON documents are too-deep errors", "[robustness]") {
  Run y = check_no_crash("deep.yaml", replace(spec_text("rgcn.yaml"), "  in_dim: 64", "  in_dim: " + repeat("[", 100000) + repeat("]", 100000)));
  CHECK(y.code == 1);
  CHECK(y.err.find("lists and mappings nested too deeply [too-deep]") != std::string::npos);
  Run j = check_no_crash("deep.json", replace(spec_text("rgcn.json"), "\"in_dim\": 64", "\"in_dim\": " + repeat("[", 100000) + repeat("]", 100000)));
  CHECK(j.code == 1);
  CHECK(starts_with(j.err, "4:1021: error: lists and objects nested too deeply (more than 1000 levels) [too-deep]"));
}

TEST_CASE("a shared 1-D weight used element-wise is generated (fuzzer seed 12)", "[robustness]") {
  // Was: internal error "traversal: unknown name W0" in the CUDA emitter.
  Run r = check_well_behaved("w1d.yaml", replace(spec_text("rgcn.yaml"), "  W0: {per: none, shape: [in_dim, out_dim]}",
                                                 "  W0: {per: none, shape: [in_dim, ]}"));
  CHECK(r.code == 0);
}
