#include "spec/loader.h"

#include <fmt/format.h>
#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "dsl/parser.h"
#include "ir/inter/names.h"
#include "ir/inter/constant.h"
#include "ir/intra/launch.h"

namespace hectorgen::spec {

using namespace inter;

Format detect_format(const std::string& path, const std::string& text) {
  auto ends_with = [&](std::string_view suffix) {
    return path.size() >= suffix.size() && path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (ends_with(".json")) return Format::Json;
  if (ends_with(".yaml") || ends_with(".yml")) return Format::Yaml;
  size_t first = text.find_first_not_of(" \t\r\n");
  return first != std::string::npos && text[first] == '{' ? Format::Json : Format::Yaml;
}

namespace {

class SchemaReader {
 public:
  SchemaReader(const SourceFile& f, Diagnostics& d) : f_(f), d_(d) {}

  SourceLoc loc(const YAML::Node& n) const {
    YAML::Mark m = n.Mark();
    // An empty value (`model:` then a newline) is marked where the next token starts, often on a later
    // line: point at its key instead.
    if (n.IsNull() && null_key_.valid() && (m.line < 0 || m.line + 1 != null_key_.line)) return null_key_;
    if (m.line < 0) return {&f_, 0, 0};
    return {&f_, m.line + 1, m.column + 1};
  }
  SourceLoc key_loc(const YAML::const_iterator::value_type& kv) const { return loc(kv.first); }

  void error(const YAML::Node& n, const char* kind, std::string msg) { d_.error(loc(n), kind, std::move(msg)); }

  // Names become identifiers in the generated code (and the manifest's JSON).
  // Names become identifiers in the generated code (and the manifest's JSON); the emitters mangle what
  // collides with a target language. Some are reserved (inter::reserved_name_reason).
  void check_name(SourceLoc at, const std::string& what, const std::string& name) {
    if (std::string why = bad_name_reason(name); !why.empty())
      d_.error(at, "bad-name", fmt::format("{} '{}' {}", what, name, why));
    else if (std::string reserved = reserved_name_reason(name); !reserved.empty())
      d_.error(at, "reserved-name", fmt::format("{} '{}' {}", what, name, reserved));
  }

  // Weights and hyper-parameters are named bare in the program.
  void check_bare_name(SourceLoc at, const std::string& what, const std::string& name) {
    if (bad_name_reason(name).empty() && reserved_name_reason(name).empty())
      if (std::string why = dsl::bare_name_reason(name); !why.empty())
        d_.error(at, "reserved-name", fmt::format("{} '{}' {}", what, name, why));
  }

  static const char* type_name(const YAML::Node& n) {
    switch (n.Type()) {
      case YAML::NodeType::Null: return "null";
      case YAML::NodeType::Scalar: return "a scalar";
      case YAML::NodeType::Sequence: return "a list";
      case YAML::NodeType::Map: return "a mapping";
      default: return "nothing";
    }
  }

  bool expect_type(const YAML::Node& n, YAML::NodeType::value t, std::string_view what) {
    if (n.Type() == t) return true;
    const char* want = t == YAML::NodeType::Map ? "a mapping" : t == YAML::NodeType::Sequence ? "a list" : "a scalar";
    error(n, "wrong-type", fmt::format("{} must be {}, got {}", what, want, type_name(n)));
    return false;
  }

  // Iterates a mapping, rejecting duplicate and unknown keys.
  template <class F>
  void for_each_key(const YAML::Node& map, std::string_view what, std::initializer_list<std::string_view> known, F&& f) {
    std::set<std::string> seen;
    for (auto it = map.begin(); it != map.end(); ++it) {
      if (!it->first.IsScalar()) {
        error(it->first, "wrong-type", fmt::format("keys of {} must be names", what));
        continue;
      }
      std::string key = it->first.Scalar();
      if (!seen.insert(key).second) {
        error(it->first, "duplicate-key", fmt::format("duplicate key '{}' in {}", key, what));
        continue;
      }
      if (known.size() && std::find(known.begin(), known.end(), key) == known.end()) {
        std::string list;
        for (auto k : known) list += (list.empty() ? "" : ", ") + std::string(k);
        error(it->first, "unknown-key", fmt::format("unknown key '{}' in {} (expected one of: {})", key, what, list));
        continue;
      }
      SourceLoc outer = std::exchange(null_key_, it->second.IsNull() ? loc(it->first) : SourceLoc{});
      f(key, it->first, it->second);
      null_key_ = outer;
    }
  }

  std::optional<std::string> string_value(const YAML::Node& n, std::string_view what) {
    if (!expect_type(n, YAML::NodeType::Scalar, what)) return std::nullopt;
    return n.Scalar();
  }

  std::optional<bool> bool_value(const YAML::Node& n, std::string_view what) {
    if (!expect_type(n, YAML::NodeType::Scalar, what)) return std::nullopt;
    const std::string& s = n.Scalar();
    if (s == "true" || s == "on" || s == "yes") return true;
    if (s == "false" || s == "off" || s == "no") return false;
    error(n, "wrong-type", fmt::format("{} must be true/false (or on/off), got '{}'", what, s));
    return std::nullopt;
  }

  // A number in [0, 1] (a ratio such as unique pairs / edges).
  std::optional<double> fraction_value(const YAML::Node& n, std::string_view what) {
    if (!expect_type(n, YAML::NodeType::Scalar, what)) return std::nullopt;
    const std::string& s = n.Scalar();
    char* end = nullptr;
    double v = std::strtod(s.c_str(), &end);
    if (s.empty() || *end != '\0' || !std::isfinite(v)) {
      error(n, "wrong-type", fmt::format("{} must be a number between 0 and 1, got '{}'", what, s));
      return std::nullopt;
    }
    if (v < 0 || v > 1) {
      error(n, "bad-value",
            fmt::format("{} must be between 0 and 1 (the largest unique pairs / edges ratio of a relation that is "
                        "compacted), got {}", what, s));
      return std::nullopt;
    }
    return v;
  }

  std::optional<int> int_value(const YAML::Node& n, std::string_view what, int lo, int hi) {
    if (!expect_type(n, YAML::NodeType::Scalar, what)) return std::nullopt;
    const std::string& s = n.Scalar();
    char* end = nullptr;
    long v = std::strtol(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0') {
      error(n, "wrong-type", fmt::format("{} must be an integer, got '{}'", what, s));
      return std::nullopt;
    }
    if (v < lo || v > hi) {
      error(n, "bad-value", fmt::format("{} must be between {} and {}, got {}", what, lo, hi, v));
      return std::nullopt;
    }
    return static_cast<int>(v);
  }

  // Where each byte of a scalar's value sits in the file: the scalar's source text from its mark on is
  // followed through quotes, escapes ("\"", \n, \u00e9, '') and line breaks folded into spaces. Empty
  // when the source cannot be followed (block scalars, anything unexpected).
  std::vector<SourceLoc> scalar_byte_locs(const YAML::Node& n) const {
    const std::string& v = n.Scalar();
    const std::string& src = f_.text();
    YAML::Mark m = n.Mark();
    if (m.line < 0 || m.line + 1 > f_.line_count() || v.empty()) return {};
    std::string_view first = f_.line(m.line + 1);
    size_t p = static_cast<size_t>(first.data() - src.data()) + static_cast<size_t>(m.column);
    if (p >= src.size()) return {};
    char quote = src[p] == '"' || src[p] == '\'' ? src[p] : 0;
    if (!quote && (src[p] == '|' || src[p] == '>')) return {};
    if (quote) ++p;
    auto at = [&](size_t off) {
      auto [line, col] = f_.position(off);
      return SourceLoc{&f_, line, col};
    };
    auto hex = [&](size_t b, size_t n, uint32_t& out) {
      out = 0;
      for (size_t k = b; k < b + n; ++k) {
        if (k >= src.size() || !std::isxdigit(static_cast<unsigned char>(src[k]))) return false;
        out = out * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(src[k])) ? src[k] - '0' : (src[k] | 0x20) - 'a' + 10);
      }
      return true;
    };
    std::vector<SourceLoc> out;
    size_t i = 0;
    while (i < v.size()) {
      if (p >= src.size()) return {};
      char c = src[p];
      // A line break (with the blanks around it) folds into one space, or into n-1 newlines for n breaks.
      size_t q = p;
      while (q < src.size() && (src[q] == ' ' || src[q] == '\t')) ++q;
      if (q < src.size() && (src[q] == '\n' || src[q] == '\r')) {
        int breaks = 0;
        size_t brk = q;
        while (q < src.size() && (src[q] == ' ' || src[q] == '\t' || src[q] == '\n' || src[q] == '\r'))
          breaks += src[q++] == '\n';
        std::string folded = breaks <= 1 ? std::string(" ") : std::string(static_cast<size_t>(breaks - 1), '\n');
        if (breaks == 0 || v.compare(i, folded.size(), folded) != 0) return {};
        for (size_t k = 0; k < folded.size(); ++k) out.push_back(at(brk));
        i += folded.size();
        p = q;
        continue;
      }
      if (quote == '"' && c == '\\') {
        if (p + 1 >= src.size()) return {};
        char e = src[p + 1];
        size_t len = 2, bytes = 1;
        uint32_t cp = 0;
        if (e == 'x' || e == 'u' || e == 'U') {
          size_t digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (!hex(p + 2, digits, cp)) return {};
          len += digits;
          bytes = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
        } else if (e == 'N' || e == '_') {
          bytes = 2;  // U+0085, U+00A0
        } else if (e == 'L' || e == 'P') {
          bytes = 3;  // U+2028, U+2029
        } else if (e == '\n' || e == '\r') {
          return {};  // an escaped line break: rare, not followed
        }
        for (size_t k = 0; k < bytes && i < v.size(); ++k, ++i) out.push_back(at(p));
        p += len;
        continue;
      }
      if (quote && c == quote) {
        if (quote == '"' || p + 1 >= src.size() || src[p + 1] != '\'') return {};  // the end of the string
        ++p;  // '' stands for '
      }
      if (src[p] != v[i]) return {};
      out.push_back(at(p));
      ++p;
      ++i;
    }
    return out;
  }

  // A scalar holding a number or a constant expression, parsed with the DSL's expression grammar.
  ExprP expr_value(const YAML::Node& n, std::string_view what) {
    if (!expect_type(n, YAML::NodeType::Scalar, what)) return nullptr;
    dsl::ProgramText text;
    text.text = n.Scalar();
    text.file = &f_;
    SourceLoc l = loc(n);
    int quote = (n.Tag() == "!" ? 1 : 0);  // quoted scalars start one column later
    text.origins.push_back({l.line, l.col - 1 + quote});
    if (text.text.find('\n') != std::string::npos) {
      error(n, "bad-value", fmt::format("{} must be on one line", what));
      return nullptr;
    }
    if (auto at = scalar_byte_locs(n); !at.empty()) text.byte_locs.push_back(std::move(at));
    return dsl::parse_expression(text, d_);
  }

  TensorDecl tensor(const std::string& name, const YAML::Node& key, const YAML::Node& n, std::string_view section,
                    std::initializer_list<Per> allowed) {
    TensorDecl t;
    t.name = name;
    t.loc = loc(key);
    check_name(t.loc, std::string(section), name);
    if (section == "weight") check_bare_name(t.loc, "weight", name);
    else if (bad_name_reason(name).empty() && reserved_name_reason(name).empty())
      if (std::string why = attribute_name_reason(name); !why.empty())
        d_.error(t.loc, "reserved-name", fmt::format("{} '{}' {}", section, name, why));
    std::string what = fmt::format("{} '{}'", section, name);
    if (!expect_type(n, YAML::NodeType::Map, what)) return t;
    bool is_weight = section == "weight", is_input = section == "input";
    bool has_per = false, has_shape = false;
    SourceLoc placement_at, rows_at, requires_grad_at;  // where 'placement', 'rows' and 'requires_grad' were written
    bool requires_grad_given = false;
    std::initializer_list<std::string_view> known_input = {"per",       "shape", "from_graph", "requires_grad",
                                                           "placement", "rows",  "doc"};
    std::initializer_list<std::string_view> known_weight = {"per", "shape", "init", "requires_grad", "doc"};
    std::initializer_list<std::string_view> known_output = {"per", "shape", "doc"};
    for_each_key(n, what, is_input ? known_input : is_weight ? known_weight : known_output,
                 [&](const std::string& k, const YAML::Node&, const YAML::Node& v) {
      if (k == "per") {
        has_per = true;
        auto s = string_value(v, "'per'");
        if (!s) return;
        auto p = parse_per(*s);
        if (!p || std::find(allowed.begin(), allowed.end(), *p) == allowed.end()) {
          std::string list;
          for (Per a : allowed) list += (list.empty() ? "" : ", ") + std::string(to_string(a));
          error(v, "bad-value", fmt::format("{}: 'per' must be one of {}, got '{}'", what, list, *s));
          return;
        }
        t.per = *p;
      } else if (k == "shape") {
        has_shape = true;
        if (!expect_type(v, YAML::NodeType::Sequence, "'shape'")) return;
        for (const YAML::Node& dim : v)
          if (ExprP e = expr_value(dim, "a shape entry")) t.shape_exprs.push_back(e);
      } else if (k == "from_graph") {
        auto s = string_value(v, "'from_graph'");
        if (!s) return;
        if (*s != "inv_relation_in_degree") {
          error(v, "bad-value", fmt::format("unknown graph quantity '{}' (known: inv_relation_in_degree)", *s));
          return;
        }
        t.from_graph = *s;
      } else if (k == "requires_grad") {
        if (auto b = bool_value(v, "'requires_grad'")) t.requires_grad = *b;
        requires_grad_given = true;
        requires_grad_at = loc(v);
      } else if (k == "rows") {
        auto s = string_value(v, "'rows'");
        if (!s) return;
        if (*s != "nodes" && *s != "indexed") {
          error(v, "bad-value", fmt::format("{}: 'rows' must be nodes or indexed, got '{}'", what, *s));
          return;
        }
        t.indexed_rows = *s == "indexed";
        rows_at = loc(v);
      } else if (k == "placement") {
        auto s = string_value(v, "'placement'");
        if (!s) return;
        if (*s != "device" && *s != "unified") {
          error(v, "bad-value", fmt::format("{}: 'placement' must be device or unified, got '{}'", what, *s));
          return;
        }
        t.unified = *s == "unified";
        placement_at = loc(v);
      } else if (k == "init") {
        auto s = string_value(v, "'init'");
        if (s && *s != "glorot" && *s != "ones" && *s != "zeros") {
          error(v, "bad-value", fmt::format("'init' must be glorot, ones or zeros, got '{}'", *s));
          return;
        }
        if (s) t.init = *s;
      }
    });
    if (!has_per) d_.error(t.loc, "missing-field", fmt::format("{} is missing 'per'", what));
    if (!has_shape) d_.error(t.loc, "missing-field", fmt::format("{} is missing 'shape'", what));
    if (is_weight && t.init.empty()) t.init = "glorot";
    if (t.unified && !t.from_graph.empty())
      d_.error(placement_at, "bad-value", fmt::format("{}: 'placement: unified' is for user inputs, not 'from_graph' ones", what));
    else if (t.unified && has_per && t.per != Per::Node)
      d_.error(placement_at, "bad-value", fmt::format("{}: 'placement: unified' needs 'per: node', got 'per: {}'", what, to_string(t.per)));
    if (t.indexed_rows && !t.from_graph.empty()) {
      d_.error(rows_at, "bad-value", fmt::format("{}: 'rows: indexed' is for user inputs, not 'from_graph' ones", what));
    } else if (t.indexed_rows && has_per && t.per != Per::Node) {
      d_.error(rows_at, "bad-value", fmt::format("{}: 'rows: indexed' needs 'per: node', got 'per: {}'", what, to_string(t.per)));
    } else if (t.indexed_rows && requires_grad_given && t.requires_grad) {
      d_.error(requires_grad_at, "bad-value",
               fmt::format("{}: an input with 'rows: indexed' has no gradient (its rows are read through a map); "
                           "drop 'requires_grad: true'", what));
    }
    if (t.indexed_rows) t.requires_grad = false;
    return t;
  }

  void options(const YAML::Node& n, Options& o) {
    if (!expect_type(n, YAML::NodeType::Map, "'options'")) return;
    for_each_key(n, "'options'", {"materialization", "compact_relations", "reorder", "recompute", "dtype", "schedule"},
                 [&](const std::string& k, const YAML::Node&, const YAML::Node& v) {
      if (k == "materialization") {
        auto s = string_value(v, "'materialization'");
        if (!s) return;
        if (auto m = parse_materialization(*s)) o.materialization = *m;
        else error(v, "bad-value", fmt::format("'materialization' must be vanilla, compact or auto, got '{}'", *s));
      } else if (k == "compact_relations") {
        if (auto theta = fraction_value(v, "'compact_relations'")) o.compact_relations = *theta;
      } else if (k == "reorder") {
        auto s = string_value(v, "'reorder'");
        if (!s) return;
        if (auto r = parse_reorder(*s)) o.reorder = *r;
        else if (*s == "true" || *s == "yes") o.reorder = Reorder::On;
        else if (*s == "false" || *s == "no") o.reorder = Reorder::Off;
        else error(v, "bad-value", fmt::format("'reorder' must be on, off or auto, got '{}'", *s));
      } else if (k == "recompute") {
        auto s = string_value(v, "'recompute'");
        if (!s) return;
        if (auto r = parse_recompute(*s)) o.recompute = *r;
        else if (*s == "true" || *s == "yes") o.recompute = Recompute::On;
        else if (*s == "false" || *s == "no") o.recompute = Recompute::Off;
        else error(v, "bad-value", fmt::format("'recompute' must be auto, on or off, got '{}'", *s));
      } else if (k == "dtype") {
        auto s = string_value(v, "'dtype'");
        if (!s) return;
        if (auto dt = parse_dtype(*s)) o.dtype = *dt;
        else error(v, "bad-value", fmt::format("'dtype' must be fp32, tf32, bf16 or fp16, got '{}'", *s));
      } else if (k == "schedule") {
        schedule(v, o.schedule);
      }
    });
  }

  // options.schedule: each value is read as an integer, then the whole schedule is checked at once (a tile
  // is valid or not depending on the coarsening, launch bounds on both), errors pointing at the value at fault.
  void schedule(const YAML::Node& v, Schedule& out) {
    if (!expect_type(v, YAML::NodeType::Map, "'schedule'")) return;
    std::map<intra::ScheduleKey, YAML::Node> at;  // where each value was written
    Schedule s = out;
    bool ok = true;
    auto read = [&](const YAML::Node& n, std::string_view what, intra::ScheduleKey key, auto&& set) {
      if (auto i = int_value(n, what, INT_MIN, INT_MAX)) {
        set(*i);
        at[key] = n;
      } else {
        ok = false;
      }
    };
    // A value that is auto (0) or a number; a word other than auto is a type error naming the numbers it may be.
    auto read_auto = [&](const YAML::Node& n, std::string_view name, std::string_view numbers, intra::ScheduleKey key,
                         auto&& set) {
      if (n.IsScalar() && n.Scalar() == "auto") {
        set(0);
        at[key] = n;
      } else if (n.IsScalar() && !n.Scalar().empty() && std::isalpha(static_cast<unsigned char>(n.Scalar()[0]))) {
        error(n, "wrong-type", fmt::format("'{}' must be auto or {}, got '{}'", name, numbers, n.Scalar()));
        ok = false;
      } else {
        read(n, fmt::format("'{}'", name), key, set);
      }
    };
    for_each_key(v, "'schedule'", {"gemm", "traversal", "gather_sum"}, [&](const std::string& sk, const YAML::Node&, const YAML::Node& sv) {
      if (!expect_type(sv, YAML::NodeType::Map, fmt::format("'schedule.{}'", sk))) {
        ok = false;
        return;
      }
      if (sk == "gemm") {
        for_each_key(sv, "'schedule.gemm'", {"tile", "coarsen", "launch_bounds"},
                     [&](const std::string& gk, const YAML::Node&, const YAML::Node& gv) {
          if (gk == "tile") read(gv, "'tile'", intra::ScheduleKey::Tile, [&](int i) { s.gemm_tile = i; });
          else if (gk == "coarsen") read(gv, "'coarsen'", intra::ScheduleKey::Coarsen, [&](int i) { s.gemm_coarsen = i; });
          else read(gv, "'launch_bounds'", intra::ScheduleKey::LaunchBounds, [&](int i) { s.launch_bounds = i; });
        });
      } else if (sk == "gather_sum") {
        for_each_key(sv, "'schedule.gather_sum'", {"row_lanes", "group_rows_below"},
                     [&](const std::string& gk, const YAML::Node&, const YAML::Node& gv) {
          if (gk == "row_lanes")
            read_auto(gv, "row_lanes", "a number of lanes (8, 16 or 32)", intra::ScheduleKey::GatherSumRowLanes,
                      [&](int i) { s.gather_sum_row_lanes = i; });
          else  // auto is -1 here: 0 means never
            read_auto(gv, "group_rows_below", "an average number of entries a row (0: never)",
                      intra::ScheduleKey::GatherSumGroupRowsBelow, [&](int i) {
                        if (gv.Scalar() == "auto") {
                          s.gather_sum_group_rows_below = -1;
                        } else if (i < 0) {
                          // (not left to check_schedule: -1 is auto there)
                          error(gv, "bad-schedule", intra::group_rows_below_problem(i));
                          ok = false;
                        } else {
                          s.gather_sum_group_rows_below = i;
                        }
                      });
        });
      } else {
        for_each_key(sv, "'schedule.traversal'", {"threads", "edge_batch", "row_lanes", "vector", "position_indices"},
                     [&](const std::string& tk, const YAML::Node&, const YAML::Node& tv) {
          if (tk == "threads") read(tv, "'threads'", intra::ScheduleKey::TraversalThreads, [&](int i) { s.traversal_threads = i; });
          else if (tk == "edge_batch") read(tv, "'edge_batch'", intra::ScheduleKey::TraversalEdgeBatch, [&](int i) { s.traversal_edge_batch = i; });
          else if (tk == "position_indices")
            read(tv, "'position_indices'", intra::ScheduleKey::TraversalPositionIndices,
                 [&](int i) { s.traversal_position_indices = i; });
          else if (tk == "vector")
            read_auto(tv, "vector", "a number of elements (1, 2, 4 or 8)", intra::ScheduleKey::TraversalVector,
                      [&](int i) { s.traversal_vector = i; });
          else
            read_auto(tv, "row_lanes", "a number of lanes (8, 16 or 32)", intra::ScheduleKey::TraversalRowLanes,
                      [&](int i) { s.traversal_row_lanes = i; });
        });
      }
    });
    if (!ok) return;
    bool valid = true;
    for (const intra::ScheduleProblem& problem : intra::check_schedule(s)) {
      valid = false;
      // A problem with a default value (never written) is reported at the written value it combines with.
      auto it = at.find(problem.key);
      if (it == at.end()) it = at.begin();
      if (it == at.end()) d_.error(loc(v), "bad-schedule", problem.message);
      else error(it->second, "bad-schedule", problem.message);
    }
    if (valid) out = s;
  }

  // The program: a YAML block scalar (lines map 1:1 into the file), a string, or a list of line strings.
  std::optional<dsl::ProgramText> program(const YAML::Node& n) {
    dsl::ProgramText p;
    p.file = &f_;
    if (n.IsSequence()) {
      for (const YAML::Node& line : n) {
        if (!expect_type(line, YAML::NodeType::Scalar, "each line of 'program'")) return std::nullopt;
        if (line.Scalar().find('\n') != std::string::npos) {
          error(line, "bad-value", "a line of 'program' must not contain a newline");
          return std::nullopt;
        }
        SourceLoc l = loc(line);
        p.text += line.Scalar() + "\n";
        p.origins.push_back({l.line, l.col});  // the opening quote takes one column
        p.byte_locs.push_back(scalar_byte_locs(line));
      }
      return p;
    }
    if (!expect_type(n, YAML::NodeType::Scalar, "'program'")) return std::nullopt;
    p.text = n.Scalar();
    SourceLoc l = loc(n);
    std::string_view head = f_.line(l.line);
    bool block = l.col - 1 < static_cast<int>(head.size()) && (head[l.col - 1] == '|' || head[l.col - 1] == '>');
    int nlines = 1 + static_cast<int>(std::count(p.text.begin(), p.text.end(), '\n'));
    if (block) {
      // Block scalar: content starts on the next line; its indentation is that of the first non-blank line.
      int indent = -1;
      for (int fl = l.line + 1; fl <= f_.line_count() && indent < 0; ++fl) {
        std::string_view s = f_.line(fl);
        size_t first = s.find_first_not_of(' ');
        if (first != std::string_view::npos) indent = static_cast<int>(first);
      }
      if (indent < 0) indent = 0;
      for (int i = 0; i < nlines; ++i) p.origins.push_back({l.line + 1 + i, indent});
    } else {
      // Flow scalar: every line points into the string's first line, unless the source can be followed.
      int quote = (n.Tag() == "!" ? 1 : 0);
      for (int i = 0; i < nlines; ++i) p.origins.push_back({l.line, l.col - 1 + quote});
      // Where the source can be followed (escapes, folded lines), each byte maps exactly.
      std::vector<SourceLoc> at = scalar_byte_locs(n);
      if (at.size() == p.text.size()) {
        size_t b = 0;
        for (int i = 0; i < nlines; ++i) {
          size_t e = std::min(p.text.find('\n', b), p.text.size());
          p.byte_locs.emplace_back(at.begin() + static_cast<long>(b), at.begin() + static_cast<long>(e));
          b = e + 1;
        }
      }
    }
    return p;
  }

  std::optional<LoadedSpec> run(const YAML::Node& root) {
    LoadedSpec out;
    out.decl.loc = {&f_, 1, 1};
    if (!root.IsMap()) {
      d_.error(root.IsDefined() && !root.IsNull() ? loc(root) : SourceLoc{&f_, 1, 1}, "wrong-type",
               "a model spec must be a mapping with keys such as 'model', 'weights' and 'program'");
      return std::nullopt;
    }
    bool has_model = false, has_program = false;
    for_each_key(root, "the spec",
                 {"model", "description", "hyper", "inputs", "weights", "outputs", "options", "program"},
                 [&](const std::string& k, const YAML::Node& key, const YAML::Node& v) {
      if (k == "model") {
        has_model = true;
        auto s = string_value(v, "'model'");
        if (!s) return;
        check_name(loc(v), "model name", *s);
        out.decl.name = *s;
        out.decl.loc = loc(key);
      } else if (k == "description") {
        string_value(v, "'description'");
      } else if (k == "hyper") {
        if (!expect_type(v, YAML::NodeType::Map, "'hyper'")) return;
        for_each_key(v, "'hyper'", {}, [&](const std::string& name, const YAML::Node& hk, const YAML::Node& hv) {
          HyperParam h;
          h.name = name;
          h.loc = loc(hk);
          check_name(h.loc, "hyper-parameter", name);
          check_bare_name(h.loc, "hyper-parameter", name);
          h.expr = expr_value(hv, fmt::format("hyper-parameter '{}'", name));
          if (h.expr) out.decl.hyper.push_back(std::move(h));
        });
      } else if (k == "inputs" || k == "weights" || k == "outputs") {
        if (!expect_type(v, YAML::NodeType::Map, fmt::format("'{}'", k))) return;
        std::string section = k.substr(0, k.size() - 1);
        auto& list = k == "inputs" ? out.decl.inputs : k == "weights" ? out.decl.weights : out.decl.outputs;
        std::initializer_list<Per> allowed_data = {Per::Node, Per::Edge};
        std::initializer_list<Per> allowed_weight = {Per::Etype, Per::Ntype, Per::None};
        // Outputs may also be per type (weight gradients, written as d_W[e.etype] += ...).
        std::initializer_list<Per> allowed_output = {Per::Node, Per::Edge, Per::Etype, Per::Ntype, Per::None};
        for_each_key(v, fmt::format("'{}'", k), {}, [&](const std::string& name, const YAML::Node& tk, const YAML::Node& tv) {
          list.push_back(tensor(name, tk, tv, section,
                                k == "weights" ? allowed_weight : k == "outputs" ? allowed_output : allowed_data));
        });
      } else if (k == "options") {
        options(v, out.decl.options);
      } else if (k == "program") {
        has_program = true;
        if (auto p = program(v)) out.program = std::move(*p);
      }
    });
    if (!has_model) d_.error({&f_, 1, 1}, "missing-field", "the spec is missing 'model'");
    if (!has_program) d_.error({&f_, 1, 1}, "missing-field", "the spec is missing 'program'");
    if (out.decl.outputs.empty() && has_program)
      d_.error({&f_, 1, 1}, "missing-field", "the spec declares no 'outputs'");
    if (d_.has_errors()) return std::nullopt;
    if (!inter::evaluate_declarations(out.decl, d_)) return std::nullopt;
    return out;
  }

 private:
  const SourceFile& f_;
  Diagnostics& d_;
  SourceLoc null_key_;  // while reading an empty value: its key
};

// Records the first error of a strict JSON parse, with the byte offset where it was detected.
struct JsonErrorSax : nlohmann::json::json_sax_t {
  bool failed = false;
  size_t position = 0;
  std::string last_token, message;
  int id = 0;

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t pos, const std::string& token, const nlohmann::detail::exception& e) override {
    failed = true;
    position = pos;
    last_token = token;
    message = e.what();
    id = e.id;
    return false;
  }
};

// The first byte of the token that ends at `last` (the byte where nlohmann detected the error), for the
// kinds of errors whose token is known: strings, numbers and literals. Otherwise `last` itself.
size_t token_start(const std::string& text, size_t last, const std::string& message) {
  auto is_number = [](char c) { return std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '+' || c == 'e' || c == 'E'; };
  size_t b = last;
  if (message.find("unexpected string literal") != std::string::npos && text[last] == '"') {
    // Back to the opening quote: a '"' preceded by an even number of backslashes.
    for (size_t j = last; j-- > 0;) {
      if (text[j] == '\n') break;
      size_t slashes = 0;
      while (slashes < j && text[j - 1 - slashes] == '\\') ++slashes;
      if (text[j] == '"' && slashes % 2 == 0) return j;
    }
    return last;
  }
  if (message.find("number") != std::string::npos) {
    while (b > 0 && is_number(text[b - 1]) && is_number(text[b])) --b;
    return b;
  }
  if (message.find("invalid literal") != std::string::npos) {
    while (b > 0 && std::isalpha(static_cast<unsigned char>(text[b - 1]))) --b;
    return b;
  }
  return last;
}

// JSON is checked with a strict JSON parser first (YAML would accept more than JSON allows).
bool check_json_syntax(const SourceFile& file, Diagnostics& diags) {
  JsonErrorSax sax;
  try {
    nlohmann::json::sax_parse(file.text(), &sax);
  } catch (const nlohmann::json::exception& e) {  // defensive: the SAX interface reports, not throws
    sax.failed = true;
    sax.position = 0;
    sax.message = e.what();
  }
  if (!sax.failed) {
    // The YAML parser that reads the document next gives up on deep nesting without saying where.
    constexpr int kMaxDepth = 1000;
    const std::string& text = file.text();
    int depth = 0;
    bool in_string = false;
    for (size_t i = 0; i < text.size(); ++i) {
      char c = text[i];
      if (in_string) {
        if (c == '\\') ++i;
        else if (c == '"') in_string = false;
      } else if (c == '"') {
        in_string = true;
      } else if (c == '[' || c == '{') {
        if (++depth > kMaxDepth) {
          auto [line, col] = file.position(i);
          diags.error({&file, line, col}, "too-deep", fmt::format("lists and objects nested too deeply (more than {} levels)", kMaxDepth));
          return false;
        }
      } else if (c == ']' || c == '}') {
        --depth;
      }
    }
    return true;
  }
  // The error is detected at the last byte read: point at the first byte of the offending token.
  const std::string& text = file.text();
  size_t at = 0;
  if (!text.empty()) at = token_start(text, std::min(sax.position > 0 ? sax.position - 1 : 0, text.size() - 1), sax.message);
  auto [line, col] = file.position(at);
  // nlohmann's messages: "[json.exception.parse_error.101] parse error at line 3, column 5: <detail>",
  // "[json.exception.out_of_range.406] number overflow parsing '1e400'".
  std::string detail = sax.message;
  if (size_t p = detail.find("] "); detail.rfind("[json.exception.", 0) == 0 && p != std::string::npos)
    detail = detail.substr(p + 2);
  if (size_t p = detail.find(": "); detail.rfind("parse error", 0) == 0 && p != std::string::npos)
    detail = detail.substr(p + 2);
  // "; last read: '<token>'" shows nlohmann's token buffer, which may hold earlier text: the caret says more.
  if (size_t lr = detail.find("; last read: '"); lr != std::string::npos) {
    size_t end = detail.find("'; expected", lr + 14);
    if (end == std::string::npos && detail.back() == '\'') end = detail.size() - 1;
    if (end != std::string::npos) detail.erase(lr, end + 1 - lr);
  }
  if (sax.id == 406) detail = fmt::format("number {} is out of range (JSON numbers must fit in a double)", sax.last_token);
  diags.error({&file, line, col}, "json-syntax", detail);
  return false;
}

}  // namespace

std::optional<LoadedSpec> load_spec(const SourceFile& file, Diagnostics& diags) {
  Format fmt = detect_format(file.path(), file.text());
  if (fmt == Format::Json && !check_json_syntax(file, diags)) return std::nullopt;
  // YAML allows no NUL bytes; yaml-cpp misreads them (as escapes or the end of the input).
  if (size_t nul = file.text().find('\0'); fmt == Format::Yaml && nul != std::string::npos) {
    auto [line, col] = file.position(nul);
    diags.error({&file, line, col}, "yaml-syntax", "NUL byte (\\x00) in the file; YAML does not allow it");
    return std::nullopt;
  }
  YAML::Node root;
  try {
    root = YAML::Load(file.text());
  } catch (const YAML::Exception& e) {
    SourceLoc l{&file, e.mark.line >= 0 ? e.mark.line + 1 : 1, e.mark.column >= 0 ? e.mark.column + 1 : 1};
    if (l.line > file.line_count()) l = {&file, file.line_count(), 1};
    if (dynamic_cast<const YAML::DeepRecursion*>(&e))  // yaml-cpp's message is "bad file"
      diags.error(l, "too-deep", "lists and mappings nested too deeply");
    else
      diags.error(l, fmt == Format::Json ? "json-syntax" : "yaml-syntax", e.msg);
    return std::nullopt;
  }
  try {
    return SchemaReader(file, diags).run(root);
  } catch (const YAML::Exception& e) {  // defensive: yaml-cpp throws on some malformed nodes
    diags.error({&file, e.mark.line + 1, e.mark.column + 1}, "yaml-syntax", e.msg);
    return std::nullopt;
  }
}

std::optional<Module> load_module(const SourceFile& file, Diagnostics& diags) {
  auto spec = load_spec(file, diags);
  if (!spec) return std::nullopt;
  Module m;
  m.decl = std::move(spec->decl);
  if (!dsl::parse_program(spec->program, m, diags)) return std::nullopt;
  return m;
}

}  // namespace hectorgen::spec
