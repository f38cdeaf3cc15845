#include "ir/intra/traversal.h"

#include "ir/intra/intra.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <stdexcept>

namespace hectorgen::intra {

// ---------------------------------------------------------------------------------------------------
// Types and operators
// ---------------------------------------------------------------------------------------------------
int64_t RegType::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int slot_vector(int64_t numel, int64_t slots, int vector) {
  int v = 1;
  while (v * 2 <= vector && slots % (v * 2) == 0 && numel % (v * 2) == 0) v *= 2;
  return v;
}

int64_t RegType::slots(int row_lanes) const {
  return layout == LaneLayout::Lanes ? (numel() + row_lanes - 1) / row_lanes : numel();
}

LaneLayout layout_for(int64_t numel) { return numel >= 32 ? LaneLayout::Lanes : LaneLayout::Replicated; }

const char* to_string(LaneLayout l) { return l == LaneLayout::Lanes ? "lanes" : "replicated"; }

bool is_elementwise(inter::Op op) {
  return op != inter::Op::None && op != inter::Op::Count && inter::op_info(op).form == inter::Form::Map;
}

double evaluate(inter::Op op, const std::vector<double>& args) {
  std::vector<inter::Value64> a;
  for (double x : args) a.push_back(inter::Value64::scalar(x));
  return inter::op_info(op).eval(a, inter::Type::tensor(inter::Domain::Const)).data.at(0);
}

int binding(inter::Op op) {
  const inter::OpInfo& i = inter::op_info(op);
  if (i.syntax == inter::Syntax::Prefix) return 3;
  if (i.syntax != inter::Syntax::Infix) return 4;
  for (inter::BinOp b : {inter::BinOp::Add, inter::BinOp::Sub})
    if (inter::binary_op(b) == op) return 1;
  return 2;
}

ValueP Value::reg_ref(std::string name) {
  auto v = std::make_shared<Value>();
  v->kind = Kind::Reg;
  v->reg = std::move(name);
  return v;
}

ValueP Value::constant(double x) {
  auto v = std::make_shared<Value>();
  v->kind = Kind::Const;
  v->number = x;
  return v;
}

ValueP Value::apply(inter::Op op, std::vector<ValueP> args) {
  auto v = std::make_shared<Value>();
  v->kind = Kind::Op;
  v->op = op;
  v->args = std::move(args);
  return v;
}

bool equal(const ValueP& a, const ValueP& b) {
  if (a->kind != b->kind || a->reg != b->reg || a->number != b->number || a->args.size() != b->args.size()) return false;
  if (a->kind == Value::Kind::Op && a->op != b->op) return false;
  for (size_t i = 0; i < a->args.size(); ++i)
    if (!equal(a->args[i], b->args[i])) return false;
  return true;
}

std::vector<std::string> regs_of(const ValueP& v) {
  std::vector<std::string> out;
  std::function<void(const ValueP&)> walk = [&](const ValueP& x) {
    if (x->kind == Value::Kind::Reg && std::find(out.begin(), out.end(), x->reg) == out.end()) out.push_back(x->reg);
    for (const ValueP& a : x->args) walk(a);
  };
  walk(v);
  return out;
}

namespace {
constexpr std::array<const char*, 12> kArrays = {"src",      "dst",       "etype",      "in_src",    "out_dst",
                                                 "ntype",    "pair_src",  "pair_etype", "edge_pair", "in_pair",
                                                 "in_etype", "out_etype"};
}

const char* to_string(GraphArray a) { return kArrays[static_cast<size_t>(a)]; }

std::optional<GraphArray> parse_graph_array(std::string_view s) {
  for (size_t i = 0; i < kArrays.size(); ++i)
    if (s == kArrays[i]) return static_cast<GraphArray>(i);
  return std::nullopt;
}

std::string graph_array_names() {
  std::string out;
  for (const char* name : kArrays) out += (out.empty() ? "" : ", ") + std::string(name);
  return out;
}

const char* walked_layout(inter::LoopKind k) {
  switch (k) {
    case inter::LoopKind::Edges: return layout::kSortedCoo;
    case inter::LoopKind::SrcPairs: return layout::kCompactSrc;
    case inter::LoopKind::IncomingEdges: return layout::kCsrByDst;
    case inter::LoopKind::OutgoingEdges: return layout::kCsrBySrc;
    default: return "";
  }
}

void for_each_instr(const std::vector<Instr>& body, const std::function<void(const Instr&)>& fn) {
  for (const Instr& in : body) {
    fn(in);
    if (auto* l = std::get_if<EdgeLoop>(&in.v)) for_each_instr(l->body, fn);
  }
}

std::set<std::string> read_layouts(const TraversalInstance& t) {
  std::set<std::string> out;
  for_each_instr(t.body, [&](const Instr& in) {
    if (auto* x = std::get_if<IndexDef>(&in.v); x && x->array == GraphArray::InPair) out.insert(layout::kCsrByDstPairs);
  });
  return out;
}

bool is_kernel_reserved(std::string_view name) {
  static const std::set<std::string, std::less<>> names = {
      // declared or called by the printed kernel
      "lane", "first_row", "row_stride", "num_rows", "j", "m", "partial", "total", "warp_sum", "warp_max", "leaky_relu",
      "row_group", "warp_row", "row_live", "group_sum", "group_max", "max", "kRowLanes",
      "run", "load_run", "store_run", "run_to_float", "run_from_float", "RunWord", "RunChunk", "run_word", "run_values",
      "run_addr", "kRun", "RunElem", "kRunBytes", "kRunPer", "uint2", "uint4",
      "in_ptr", "in_eid", "out_ptr", "out_eid", "src", "dst", "etype", "in_src", "out_dst", "ntype",
      "pair_src", "pair_etype_ptr", "edge_pair", "in_pair", "in_etype", "out_etype", "pair_edge_ptr", "pair_edge_eid",
      "node_pair_ptr", "node_pair",
      "num_etypes", "segment_of",
      // CUDA
      "threadIdx", "blockIdx", "blockDim", "gridDim", "warpSize", "atomicAdd", "expf", "sqrtf", "tanhf", "fmaxf",
      // C++ keywords and the types the printer spells
      "alignas", "alignof", "and", "and_eq", "asm", "auto", "bitand", "bitor", "bool", "break", "case", "catch", "char",
      "char8_t", "char16_t", "char32_t", "class", "compl", "concept", "const", "consteval", "constexpr", "constinit",
      "const_cast", "continue", "co_await", "co_return", "co_yield", "decltype", "default", "delete", "do", "double",
      "dynamic_cast", "else", "enum", "explicit", "export", "extern", "false", "float", "for", "friend", "goto", "if",
      "inline", "int", "int32_t", "int64_t", "long", "mutable", "namespace", "new", "noexcept", "not", "not_eq",
      "nullptr", "operator", "or", "or_eq", "private", "protected", "public", "register", "reinterpret_cast",
      "requires", "return", "short", "signed", "sizeof", "static", "static_assert", "static_cast", "struct", "switch",
      "template", "this", "thread_local", "throw", "true", "try", "typedef", "typeid", "typename", "union", "unsigned",
      "using", "virtual", "void", "volatile", "wchar_t", "while", "xor", "xor_eq"};
  return names.count(name) > 0;
}

// ---------------------------------------------------------------------------------------------------
// Printer
// ---------------------------------------------------------------------------------------------------
namespace {

int precedence(const Value& v) {
  if (v.kind == Value::Kind::Const) return v.number < 0 ? 3 : 4;
  if (v.kind == Value::Kind::Reg) return 4;
  return binding(v.op);
}

void print(const ValueP& v, std::string& out) {
  auto child = [&](const ValueP& c, bool parens) {
    if (parens) out += '(';
    print(c, out);
    if (parens) out += ')';
  };
  switch (v->kind) {
    case Value::Kind::Reg: out += v->reg; return;
    case Value::Kind::Const: out += fmt::format("{}", v->number); return;
    case Value::Kind::Op: break;
  }
  const inter::OpInfo& i = inter::op_info(v->op);
  int p = precedence(*v);
  if (i.syntax == inter::Syntax::Prefix) {
    out += i.name;
    child(v->args[0], precedence(*v->args[0]) < 3);
  } else if (i.syntax == inter::Syntax::Infix) {
    child(v->args[0], precedence(*v->args[0]) < p);
    out += fmt::format(" {} ", i.name);
    child(v->args[1], precedence(*v->args[1]) <= p);
  } else {
    out += i.name;
    out += '(';
    for (size_t k = 0; k < v->args.size(); ++k) {
      if (k) out += ", ";
      print(v->args[k], out);
    }
    out += ')';
  }
}

std::string print_source(const Source& s) {
  if (auto* l = std::get_if<Load>(&s)) return fmt::format("load {}[{}]{}", l->tensor, l->row, l->lane0 ? " by lane0" : "");
  if (auto* e = std::get_if<Eval>(&s)) return print_value(e->value);
  const Reduce& r = std::get<Reduce>(s);
  return fmt::format("{}_{}({}, {})", r.warp ? "warp" : "lane", r.op == ReduceOp::Sum ? "sum" : "max", print_value(r.value), r.axis);
}

void print_body(const std::vector<Instr>& body, int depth, int row_lanes, std::string& out) {
  std::string ind(static_cast<size_t>(depth) * 4, ' ');
  for (const Instr& in : body) {
    std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, Comment>) {
            out += ind + "# " + x.text + "\n";
          } else if constexpr (std::is_same_v<T, IndexDef>) {
            out += fmt::format("{}index {} = {}[{}]\n", ind, x.name, to_string(x.array), x.of);
          } else if constexpr (std::is_same_v<T, Def>) {
            out += fmt::format("{}{} {}: {} = {}\n", ind, x.is_mutable ? "var" : "let", x.name, print_reg_type(x.type, row_lanes), print_source(x.source));
          } else if constexpr (std::is_same_v<T, Update>) {
            out += fmt::format("{}{} {} {}\n", ind, x.name, inter::to_string(x.op), print_value(x.value));
          } else if constexpr (std::is_same_v<T, Store>) {
            out += fmt::format("{}store {}[{}] {} {} by {}{}\n", ind, x.tensor, x.row, x.atomic ? "+=" : "=", x.reg,
                               x.lanes == StoreLanes::Partitioned ? "lanes" : "lane0", x.atomic ? " atomic" : "");
          } else if constexpr (std::is_same_v<T, Sync>) {
            out += ind + "sync\n";
          } else {
            out += fmt::format("{}for {} in {}.{}({}) at {}{}:\n", ind, x.var, walked_layout(x.kind),
                               x.kind == inter::LoopKind::IncomingEdges ? "incoming" : "outgoing", x.node, x.pos,
                               x.split ? " split" : "");
            print_body(x.body, depth + 1, row_lanes, out);
          }
        },
        in.v);
  }
}

}  // namespace

std::string print_value(const ValueP& v) {
  std::string out;
  print(v, out);
  return out;
}

std::string print_reg_type(const RegType& t, int row_lanes) {
  std::string s = "[";
  for (size_t i = 0; i < t.shape.size(); ++i) s += (i ? ", " : "") + std::to_string(t.shape[i]);
  return s + fmt::format("] {}({})", to_string(t.layout), t.slots(row_lanes));
}

std::string print_traversal(const TraversalInstance& t) {
  std::string layout = walked_layout(t.rows);
  std::string out = fmt::format("traversal {}: rows={}{}({}) threads={}{}{}{}\n", t.name, layout.empty() ? "" : layout + ".",
                                inter::to_string(t.rows), t.row, t.threads,
                                t.edge_batch != 1 ? fmt::format(" edge_batch={}", t.edge_batch) : "",
                                t.row_lanes != 32 ? fmt::format(" row_lanes={}", t.row_lanes) : "",
                                t.vector != kDefaultVector ? fmt::format(" vector={}", t.vector) : "");
  print_body(t.body, 1, t.row_lanes, out);
  return out;
}

// ---------------------------------------------------------------------------------------------------
// Warp hazards
// ---------------------------------------------------------------------------------------------------
namespace {

// Who touches a row: lane-partitioned elements, lane 0, every lane, or (in a split loop) the lane that owns
// the loop's edge; `Own` accesses carry the loop's kind as their row, and two of them (of one kind) never
// conflict: the same edge of the row node falls to the same lane in every loop over its edges.
enum class Part { Lanes, Lane0, All, Own };

struct Access {
  std::string tensor;
  Part part;
  bool store;
  std::string row;
  std::string text;
};

bool conflict(const Access& a, const Access& b) {
  if (a.tensor != b.tensor || (!a.store && !b.store)) return false;
  if (a.part == Part::Own && b.part == Part::Own) return a.row != b.row;
  if (a.part == Part::All || b.part == Part::All) return true;
  return a.part != b.part;
}

// The global-memory access an instruction makes itself (not counting a loop's body), if any; `split` is
// the split loop the instruction is in (its edge's rows belong to one lane), or null. Atomic
// read-modify-writes never conflict with each other; plain accesses to their rows are ruled out by the
// verifier's ownership rule.
std::optional<Access> access_of(const Instr& in, const EdgeLoop* split) {
  auto own = [&](const std::string& row) { return split && row == split->var; };
  std::string owner = split ? fmt::format("split:{}", walked_layout(split->kind)) : "";
  if (auto* d = std::get_if<Def>(&in.v)) {
    if (auto* l = std::get_if<Load>(&d->source)) {
      std::string text = fmt::format("load {}[{}] into {}", l->tensor, l->row, d->name);
      if (split) return own(l->row) ? Access{l->tensor, Part::Own, false, owner, text} : Access{l->tensor, Part::All, false, l->row, text};
      return Access{l->tensor, d->type.layout == LaneLayout::Lanes ? Part::Lanes : l->lane0 ? Part::Lane0 : Part::All, false, l->row, text};
    }
  }
  if (auto* s = std::get_if<Store>(&in.v); s && !s->atomic) {
    std::string text = fmt::format("store {}[{}] by {}", s->tensor, s->row, s->lanes == StoreLanes::Partitioned ? "lanes" : "lane0");
    if (split) return Access{s->tensor, own(s->row) ? Part::Own : Part::All, true, own(s->row) ? owner : s->row, text};
    return Access{s->tensor, s->lanes == StoreLanes::Partitioned ? Part::Lanes : Part::Lane0, true, s->row, text};
  }
  return std::nullopt;
}

// Accesses a loop's body may make before its first sync (all of a nested loop's): what the state before
// the loop must not conflict with.
void leading_accesses(const std::vector<Instr>& body, const EdgeLoop* split, std::vector<Access>& out, bool& stopped) {
  for (const Instr& in : body) {
    if (stopped) return;
    if (std::holds_alternative<Sync>(in.v)) {
      stopped = true;
      return;
    }
    if (auto a = access_of(in, split)) out.push_back(*a);
    if (auto* l = std::get_if<EdgeLoop>(&in.v))
      for_each_instr(l->body, [&](const Instr& x) {
        if (auto a = access_of(x, l->split ? l : nullptr)) out.push_back(*a);
      });
  }
}

class HazardWalk {
 public:
  explicit HazardWalk(bool insert) : insert_(insert) {}
  std::optional<Hazard> found;
  bool changed = false;

  void block(std::vector<Instr>& body, std::vector<Access>& pending) {
    for (size_t i = 0; i < body.size() && !found; ++i) {
      Instr& in = body[i];
      if (std::holds_alternative<Sync>(in.v)) {
        pending.clear();
        continue;
      }
      if (auto* loop = std::get_if<EdgeLoop>(&in.v)) {
        if (insert_) {
          // The loop's own hazards first (within and across its iterations): a sync they put early in
          // the body may also separate the body from what came before the loop.
          std::vector<Access> own;
          iterations(*loop, own);
          std::vector<Access> lead;
          bool stopped = false;
          leading_accesses(loop->body, loop->split ? loop : nullptr, lead, stopped);
          if (first_conflict(pending, lead)) {
            body.insert(body.begin() + static_cast<long>(i), Instr{Sync{}});
            changed = true;
            pending.clear();
            continue;  // the loop is now at i + 1
          }
        }
        iterations(*loop, pending);
        continue;
      }
      std::optional<Access> a = access_of(in, split_);
      if (!a) continue;
      if (const Access* p = first_conflict(pending, {*a})) {
        if (!insert_) {
          found = Hazard{a->tensor, p->text, a->text};
          return;
        }
        body.insert(body.begin() + static_cast<long>(i), Instr{Sync{}});
        changed = true;
        pending.clear();
        ++i;  // the access itself, now after the sync
      }
      pending.push_back(*a);
    }
  }

 private:
  // A loop entered with `pending`: its first iteration, then a later one (what an iteration leaves pending,
  // except the accesses to the iteration's own edge: each iteration has another edge). Leaves in `pending`
  // what may be pending after the loop (it may also run no iteration).
  void iterations(EdgeLoop& loop, std::vector<Access>& pending) {
    std::vector<Access> before = pending;
    const EdgeLoop* outer = split_;
    split_ = loop.split ? &loop : nullptr;
    block(loop.body, pending);
    std::vector<Access> after_first = pending, carried;
    for (const Access& a : pending)
      if (a.row != loop.var && !(loop.split && a.part == Part::Own)) carried.push_back(a);
    block(loop.body, carried);
    split_ = outer;
    pending = before;
    for (const auto* set : {&after_first, &carried})
      for (const Access& a : *set) {
        bool seen = false;
        for (const Access& p : pending)
          seen = seen || (p.tensor == a.tensor && p.part == a.part && p.store == a.store && p.row == a.row);
        if (!seen) pending.push_back(a);
      }
  }

  static const Access* first_conflict(const std::vector<Access>& pending, const std::vector<Access>& next) {
    for (const Access& n : next)
      for (const Access& p : pending)
        if (conflict(p, n)) return &p;
    return nullptr;
  }
  bool insert_;
  const EdgeLoop* split_ = nullptr;  // the split loop whose body is being walked
};

}  // namespace

std::optional<Hazard> find_warp_hazard(const TraversalInstance& t) {
  TraversalInstance copy = t;
  HazardWalk w(false);
  std::vector<Access> pending;
  w.block(copy.body, pending);
  return w.found;
}

// ---------------------------------------------------------------------------------------------------
// Split loops
// ---------------------------------------------------------------------------------------------------
ReduceOp accumulation(const Update& u) { return u.op == inter::AssignOp::Add ? ReduceOp::Sum : ReduceOp::Max; }

namespace {

bool reads(const ValueP& v, const std::string& reg) {
  for (const std::string& r : regs_of(v))
    if (r == reg) return true;
  return false;
}

// True for `x = max(x, v)` or `x = max(v, x)` with v not reading x.
bool is_max_accumulation(const Update& u) {
  if (u.op != inter::AssignOp::Set || u.value->kind != Value::Kind::Op || u.value->op != inter::Op::Max || u.value->args.size() != 2)
    return false;
  const ValueP& a = u.value->args[0];
  const ValueP& b = u.value->args[1];
  auto is_x = [&](const ValueP& v) { return v->kind == Value::Kind::Reg && v->reg == u.name; };
  return (is_x(a) && !reads(b, u.name)) || (is_x(b) && !reads(a, u.name));
}

}  // namespace

std::string split_blocker(const EdgeLoop& l) {
  std::set<std::string> local;
  std::map<std::string, ReduceOp> accumulated;
  for (const Instr& in : l.body) {
    if (std::holds_alternative<EdgeLoop>(in.v)) return "it holds a nested loop";
    if (std::holds_alternative<Sync>(in.v)) return "it holds a sync";
    if (auto* d = std::get_if<Def>(&in.v)) {
      if (d->type.layout != LaneLayout::Replicated) return fmt::format("'{}' is spread over the lanes", d->name);
      if (auto* r = std::get_if<Reduce>(&d->source); r && r->warp) return fmt::format("'{}' is a warp reduction", d->name);
      local.insert(d->name);
    } else if (auto* s = std::get_if<Store>(&in.v)) {
      if (s->lanes != StoreLanes::Lane0) return fmt::format("the store into '{}' is spread over the lanes", s->tensor);
      if (!s->atomic && s->row != l.var) return fmt::format("the store into '{}' writes row '{}', not the loop edge's", s->tensor, s->row);
    } else if (auto* u = std::get_if<Update>(&in.v); u && !local.count(u->name)) {
      ReduceOp op = accumulation(*u);
      bool sum = u->op == inter::AssignOp::Add && !reads(u->value, u->name);
      if (!sum && !is_max_accumulation(*u)) return fmt::format("'{}' of the enclosing scope is updated by more than a sum or a maximum", u->name);
      if (auto [it, fresh] = accumulated.emplace(u->name, op); !fresh && it->second != op)
        return fmt::format("'{}' is both summed and maximised", u->name);
    }
  }
  // An accumulated register holds a lane's share inside the loop: nothing else may read it there.
  for (const auto& [reg, op] : accumulated) {
    for (const Instr& in : l.body) {
      const ValueP* v = nullptr;
      if (auto* d = std::get_if<Def>(&in.v)) {
        if (auto* e = std::get_if<Eval>(&d->source)) v = &e->value;
        else if (auto* r = std::get_if<Reduce>(&d->source)) v = &r->value;
      } else if (auto* s = std::get_if<Store>(&in.v); s && s->reg == reg) {
        return fmt::format("'{}' is accumulated and stored in the loop", reg);
      } else if (auto* u = std::get_if<Update>(&in.v); u && u->name != reg) {
        v = &u->value;
      }
      if (v && reads(*v, reg)) return fmt::format("'{}' is accumulated and read in the loop", reg);
    }
  }
  return "";
}

bool one_thread_per_row(const TraversalInstance& t) {
  for (const Instr& in : t.body) {
    if (std::holds_alternative<EdgeLoop>(in.v) || std::holds_alternative<Sync>(in.v)) return false;
    if (auto* d = std::get_if<Def>(&in.v)) {
      if (d->type.layout != LaneLayout::Replicated) return false;
      if (std::holds_alternative<Reduce>(d->source)) return false;
    } else if (auto* s = std::get_if<Store>(&in.v)) {
      if (s->lanes != StoreLanes::Lane0 || (!s->atomic && s->row != t.row)) return false;
    }
  }
  return true;
}

namespace {
bool searches_pair_etype(const std::vector<Instr>& body) {
  for (const Instr& in : body) {
    if (auto* x = std::get_if<IndexDef>(&in.v); x && x->array == GraphArray::PairEtype) return true;
    if (auto* l = std::get_if<EdgeLoop>(&in.v); l && searches_pair_etype(l->body)) return true;
  }
  return false;
}
}  // namespace

std::string row_lanes_blocker(const TraversalInstance& t) {
  if (one_thread_per_row(t)) return "one thread takes each row";
  if (searches_pair_etype(t.body)) return "the warp searches a pair's relation together";
  for (const Instr& in : t.body) {
    const auto* l = std::get_if<EdgeLoop>(&in.v);
    if (!l || l->split) continue;
    for (const Instr& b : l->body)
      if (std::holds_alternative<EdgeLoop>(b.v) || std::holds_alternative<Sync>(b.v))
        return fmt::format("the loop over {}'s edges holds a {}", l->node, std::holds_alternative<Sync>(b.v) ? "sync" : "nested loop");
  }
  return "";
}

namespace {
// Whether a loop body or the row's reduces over the lanes or holds a split loop; the widest `lanes` register.
void lane_work(const std::vector<Instr>& body, bool& reduces, int64_t& widest) {
  for (const Instr& in : body) {
    if (auto* d = std::get_if<Def>(&in.v)) {
      if (auto* r = std::get_if<Reduce>(&d->source); r && r->warp) reduces = true;
      if (d->type.layout == LaneLayout::Lanes) widest = std::max(widest, d->type.numel());
    } else if (auto* l = std::get_if<EdgeLoop>(&in.v)) {
      reduces = reduces || l->split;
      lane_work(l->body, reduces, widest);
    }
  }
}
}  // namespace

int auto_row_lanes(const TraversalInstance& t, int element_bytes) {
  bool reduces = false;
  int64_t widest = 0;
  lane_work(t.body, reduces, widest);
  int lanes = reduces ? 8 : 16;
  while (lanes < 32 && widest > 8 * lanes) lanes *= 2;
  if (!reduces && widest > 0)
    while (lanes > 8 && widest * element_bytes <= 16 * (lanes / 2)) lanes /= 2;
  return lanes;
}

void choose_row_lanes(TraversalInstance& t, int requested, int element_bytes) {
  const int lanes = requested == 0 ? auto_row_lanes(t, element_bytes) : requested;
  t.row_lanes = lanes != 32 && row_lanes_blocker(t).empty() ? lanes : 32;
}

void split_edge_loops(TraversalInstance& t) {
  for (Instr& in : t.body)
    if (auto* l = std::get_if<EdgeLoop>(&in.v)) l->split = split_blocker(*l).empty();
}

void insert_warp_syncs(TraversalInstance& t) {
  for (;;) {
    HazardWalk w(true);
    std::vector<Access> pending;
    w.block(t.body, pending);
    if (!w.changed) break;
  }
  if (find_warp_hazard(t)) throw std::logic_error("insert_warp_syncs: a hazard remains in " + t.name);
}

}  // namespace hectorgen::intra
