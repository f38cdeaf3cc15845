// Robustness: the compiler must never crash or report an internal error on malformed input.
//
// Every bundled spec is mutated several hundred times (deterministic seed): truncation, byte flips /
// insertions / deletions (NUL, tabs, non-ASCII, quotes, brackets, ':'), line deletion / duplication /
// swap, indentation changes in the program, DSL token replacements and changed numbers. Each mutant
// goes through driver::run() in-process, and a subset through the real binary as a subprocess (which
// also catches signals: segfaults, aborts, stack overflows). For every mutant:
//   * the exit code is 0 or 1, never 2 (and no exception escapes driver::run);
//   * on 1, stderr starts with `<path>:<line>:<col>: error: <message> [<kind>]`, followed by the quoted
//     source line and a caret inside (or just past the end of) that line; a diagnostic without a
//     position (`<path>: error: ...`) is accepted only for file-level kinds;
//   * on 1, the output directory is left exactly as it was (no partial output).
// Failing inputs are saved under ./robustness-failures/ (the test's working directory) for replay.
//
// Knobs for longer local runs (defaults keep the test deterministic and fast):
//   HECTORGEN_FUZZ_SEED=<n>   another seed         HECTORGEN_FUZZ_COUNT=<n>  mutants per spec
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
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

// ---- mutation operators -------------------------------------------------------------------------
// Bytes and short strings that stress lexers and parsers.
const std::vector<std::string> kNastyBytes = {
    std::string(1, '\0'), "\t", "\r", "\n", " ", "\"", "'", "[", "]", "{", "}", "(", ")", ":", ",", "#", "-",
    "|", ">", "&", "*", "!", "%", "@", "`", "\\", "=", "+", ".", "?", "$", ";",
    "\xff", "\xc3", "\xc3\xa9" /* é */, "\xe2\x80\xa8" /* U+2028 */, "\xef\xbb\xbf" /* BOM */, "\x7f", "\x01",
    "\x1b", "\xf0\x9f\x98\x80" /* emoji */};

// DSL and schema tokens: any occurrence of one is replaced by another.
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

std::string fmt_hex(unsigned char u) {
  static const char* kHex = "0123456789abcdef";
  return std::string("\\x") + kHex[u >> 4] + kHex[u & 15];
}

// The gutter Diagnostics::format puts before a quoted source line.
std::string fmt_gutter(long line) {
  std::string n = std::to_string(line);
  return std::string(n.size() < 5 ? 5 - n.size() : 0, ' ') + n + " | ";
}

std::string printable(const std::string& s, size_t max = 60) {
  std::string out;
  for (char c : s.substr(0, max)) {
    unsigned char u = static_cast<unsigned char>(c);
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (u < 0x20 || u >= 0x7f) out += fmt_hex(u);
    else out += c;
  }
  return s.size() > max ? out + "..." : out;
}

struct Mutant {
  std::string text;
  std::string what;  // how it was made, for failure messages
};

// First line of the program (the line after `program:` / `"program":`), or 0 when there is none.
size_t program_first_line(const std::vector<std::string>& lines) {
  for (size_t i = 0; i < lines.size(); ++i)
    if (lines[i].rfind("program", 0) == 0 || lines[i].find("\"program\"") != std::string::npos) return i + 1;
  return 0;
}

class Mutator {
 public:
  explicit Mutator(Rng& r) : r_(r) {}

  static constexpr int kKinds = 11;

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
  for (auto it = fs::recursive_directory_iterator(dir, ec); it != fs::recursive_directory_iterator(); it.increment(ec)) {
    std::string rel = fs::relative(it->path(), dir, ec).string();
    files[rel] = it->is_directory(ec) ? "<dir>" : read_file(it->path().string());
  }
  return files;
}

// Prepares `dir` with content that a failing run must leave alone.
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

// Diagnostic kinds that describe the whole file and may come without a position.
const std::set<std::string> kFileLevelKinds = {"missing-field", "wrong-type", "yaml-syntax", "json-syntax"};

// Checks the rendered diagnostics of a failed run; returns a description of the problem or "".
std::string check_stderr(const std::string& err, const std::string& path, const std::string& text) {
  if (err.empty()) return "exit code 1 with empty stderr";
  size_t nl = err.find('\n');
  if (nl == std::string::npos) return "stderr does not end its first line";
  std::string first = err.substr(0, nl);
  if (first.rfind(path, 0) != 0) return "first line does not start with the spec path: " + printable(first, 200);
  std::string rest = first.substr(path.size());
  static const std::regex kPositioned(R"(^:(\d+):(\d+): error: (.+) \[([a-z-]+)\]$)");
  static const std::regex kFileLevel(R"(^: error: (.+) \[([a-z-]+)\]$)");
  std::smatch m;
  if (std::regex_match(rest, m, kFileLevel)) {
    if (!kFileLevelKinds.count(m[2].str())) return "diagnostic without a position: " + printable(first, 200);
    return "";
  }
  if (!std::regex_match(rest, m, kPositioned)) return "malformed first line: " + printable(first, 200);
  long line = std::stol(m[1].str()), col = std::stol(m[2].str());
  // The quoted source line and the caret.
  std::vector<std::string> lines = source_lines(text);
  if (line < 1 || line > static_cast<long>(lines.size()))
    return "line " + std::to_string(line) + " is outside the file (" + std::to_string(lines.size()) + " lines): " +
           printable(first, 200);
  const std::string& src = lines[line - 1];
  std::string expect_quote = fmt_gutter(line) + src + "\n";
  if (err.compare(nl + 1, expect_quote.size(), expect_quote) != 0)
    return "the quoted line is not line " + std::to_string(line) + " of the file";
  if (col < 1 || col > static_cast<long>(src.size()) + 1)
    return "column " + std::to_string(col) + " is outside line " + std::to_string(line) + " (" +
           std::to_string(src.size()) + " characters): " + printable(first, 200);
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
  std::ostringstream out, err;
  Outcome r;
  try {
    r.code = driver::run(o, out, err);
  } catch (const std::exception& e) {
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

// Runs the real binary; `signal` is set when it died of one (a 20 s alarm catches hangs).
struct ProcOutcome {
  int code = -1;
  int signal = 0;
  std::string err;
};

ProcOutcome run_subprocess(const std::string& spec, const std::string& out_dir, const fs::path& scratch) {
  ProcOutcome r;
  std::string err_path = (scratch / "stderr.txt").string();
  std::string out_path = (scratch / "stdout.txt").string();
  pid_t pid = ::fork();
  if (pid == 0) {
    int e = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int o = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (e < 0 || o < 0) ::_exit(127);
    ::dup2(o, 1);
    ::dup2(e, 2);
    ::alarm(20);
    const char* argv[] = {HECTORGEN_BINARY, spec.c_str(), "-o", out_dir.c_str(), nullptr};
    ::execv(HECTORGEN_BINARY, const_cast<char* const*>(argv));
    ::_exit(127);
  }
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid) return r;
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  if (WIFEXITED(status)) r.code = WEXITSTATUS(status);
  r.err = read_file(err_path);
  return r;
}

// Saves a failing input (and appends its description to robustness-failures/failures.txt).
void save_failure(const std::string& name, const std::string& text, const std::string& description) {
  std::error_code ec;
  fs::create_directories("robustness-failures", ec);
  std::ofstream(fs::path("robustness-failures") / name, std::ios::binary) << text;
  std::ofstream(fs::path("robustness-failures") / "failures.txt", std::ios::app) << description << "\n";
}

}  // namespace

TEST_CASE("mutated specs never crash and fail with a well-formed diagnostic", "[robustness]") {
  const uint64_t seed = env_u64("HECTORGEN_FUZZ_SEED", 20240611);
  const size_t per_spec = env_u64("HECTORGEN_FUZZ_COUNT", 200);
  const size_t subprocess_every = 12;  // every 12th mutant also goes through the real binary

  fs::path tmp = fs::temp_directory_path() / ("hectorgen-robustness-" + std::to_string(::getpid()));
  fs::remove_all(tmp);
  fs::create_directories(tmp / "in");

  auto started = std::chrono::steady_clock::now();
  size_t runs = 0, failed_runs = 0, subprocess_runs = 0, positionless = 0;
  std::map<int, size_t> codes;
  std::vector<std::string> failures;

  const char* specs[] = {"rgcn.yaml", "rgat.yaml", "hgt.yaml", "rgcn.json"};
  for (size_t si = 0; si < std::size(specs); ++si) {
    const std::string name = specs[si];
    const std::string original = read_file(spec_path(name));
    REQUIRE_FALSE(original.empty());
    Rng rng(seed * 1000003u + si);
    Mutator mutator(rng);
    const std::string model = name.substr(0, name.find('.'));
    for (size_t i = 0; i < per_spec; ++i) {
      Mutant m{original, ""};
      mutator.apply(static_cast<int>(i % Mutator::kKinds), m);
      const std::string spec = (tmp / "in" / name).string();
      std::ofstream(spec, std::ios::binary | std::ios::trunc) << m.text;
      const fs::path out = tmp / "out";
      populate(out, model + ".inter.ir");
      const auto before = snapshot(out);

      Outcome r = run_in_process(spec, out.string());
      ++runs;
      ++codes[r.code];
      std::string problem;
      if (r.code != 0 && r.code != 1) {
        problem = "exit code " + std::to_string(r.code) + ": " + printable(r.err, 300);
      } else if (r.code == 1) {
        problem = check_stderr(r.err, spec, m.text);
        if (problem.empty() && r.err.compare(spec.size(), 8, ": error:") == 0) ++positionless;
        if (problem.empty() && snapshot(out) != before) problem = "the output directory changed on failure";
        if (problem.empty() && !r.out.empty()) problem = "stdout is not empty on failure";
      }
      if (r.code == 1) ++failed_runs;

      if (problem.empty() && i % subprocess_every == 0) {
        populate(out, model + ".inter.ir");
        ProcOutcome p = run_subprocess(spec, out.string(), tmp);
        ++subprocess_runs;
        if (p.signal) problem = "the binary died of signal " + std::to_string(p.signal) + " (" + strsignal(p.signal) + ")";
        else if (p.code != 0 && p.code != 1)
          problem = "the binary exited with " + std::to_string(p.code) + ": " + printable(p.err, 300);
        else if (p.code != r.code)
          problem = "the binary exited with " + std::to_string(p.code) + ", driver::run returned " + std::to_string(r.code);
        else if (p.code == 1 && p.err != r.err)
          problem = "the binary's stderr differs from driver::run's";
        else if (p.code == 1 && snapshot(out) != before)
          problem = "the binary changed the output directory on failure";
      }

      if (!problem.empty()) {
        std::string saved = std::to_string(seed) + "-" + std::to_string(i) + "-" + name;
        failures.push_back(name + " #" + std::to_string(i) + " [" + m.what + "] (saved as robustness-failures/" +
                           saved + "): " + problem);
        save_failure(saved, m.text, failures.back());
      }
    }
  }
  fs::remove_all(tmp);

  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::ostringstream summary;
  summary << runs << " mutants (" << codes[0] << " accepted, " << failed_runs << " rejected, " << positionless
          << " without a position), " << subprocess_runs << " through the binary, " << secs << " s";
  WARN(summary.str());
  CHECK(runs >= 600);
  CHECK(subprocess_runs >= 50);
  for (const std::string& f : failures) FAIL_CHECK(f);
  CHECK(failures.empty());
}
