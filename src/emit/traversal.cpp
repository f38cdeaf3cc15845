// The CUDA printer of traversal instances. Every decision (registers, lane layouts, loads, stores,
// reductions, syncs) is in the instance; this file only spells it: one warp per row in a grid-stride loop (or,
// with row_lanes G below 32, one group of G lanes per row, the warp's rows in step), `lanes` registers as
// `x[j]` = element lane + G j, `replicated` ones as `x[j]` = element j, a register of one slot as a plain
// float, slot loops only over more than one slot.
#include "emit/traversal.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <functional>
#include <map>
#include <regex>
#include <stdexcept>
#include <utility>

#include "emit/emit.h"
#include "emit/printer.h"
#include "ir/intra/launch.h"

namespace hectorgen::emit {

using namespace intra;

std::string float_literal(double v) {
  std::string s = fmt::format("{}", static_cast<float>(v));
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s + "f";
}

namespace {

// A C expression and its precedence: 1 additive, 2 multiplicative, 3 unary, 4 primary.
struct CExpr {
  std::string text;
  int prec = 4;
};

std::string paren(const CExpr& e, bool p) { return p ? "(" + e.text + ")" : e.text; }

class TraversalPrinter {
 public:
  TraversalPrinter(const Program& p, const TraversalInstance& t) : p_(p), t_(t), G_(t.row_lanes) {}

  TraversalCode run() {
    CodeWriter body;
    w_ = &body;
    scopes_.emplace_back();
    const bool per_thread = intra::one_thread_per_row(t_);
    split_ = per_thread;  // as in a split loop: each thread loads and stores its own row's values
    {
      CodeWriter::Indent i1(body);
      CodeWriter::Indent i2(body);
      block(t_.body);
    }
    split_ = false;
    const bool pair_rows = t_.rows == inter::LoopKind::SrcPairs;
    const bool node_rows = t_.rows != inter::LoopKind::Edges && !pair_rows;
    const std::string rows = pair_rows ? "a.num_pairs" : node_rows ? "a.num_nodes" : "a.num_edges";
    // Signature: graph arrays, then tensors, in a fixed order.
    std::vector<std::string> params, args;
    params.push_back("int64_t num_rows");
    args.push_back(rows);
    if (uses_num_etypes_) {
      params.push_back("int num_etypes");
      args.push_back("a.num_etypes");
    }
    for (const std::string& g : graph_arrays(p_))
      if (graph_used_.count(g)) {
        params.push_back(fmt::format("const int32_t* __restrict__ {}", g));
        args.push_back("a." + g);
      }
    for (const TensorInfo& t : p_.tensors) {
      if (!tensors_used_.count(t.name)) continue;
      params.push_back(fmt::format("{}{}* __restrict__ {}", written_.count(t.name) ? "" : "const ", intra::cuda_type(t.storage), t.name));
      args.push_back("a." + t.name);
    }
    TraversalCode r;
    r.helpers = helpers_;
    CodeWriter k;
    const char* per = pair_rows    ? "(source, edge type) pair"
                      : !node_rows ? "edge"
                      : t_.rows == inter::LoopKind::DstNodes ? "destination node" : "source node";
    k.line(fmt::format("// {}: traversal instance, one {} per {}", t_.name, per_thread ? "thread" : "warp", per));
    k.line(fmt::format("__global__ void __launch_bounds__({}) {}(", t_.threads, t_.name));
    for (size_t i = 0; i < params.size(); ++i) k.line(fmt::format("    {}{}", params[i], i + 1 < params.size() ? "," : ") {"));
    if (per_thread) {
      k.line("  const int64_t first_row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;");
      k.line("  const int64_t row_stride = static_cast<int64_t>(gridDim.x) * blockDim.x;");
      k.line(fmt::format("  for (int64_t {0} = first_row; {0} < num_rows; {0} += row_stride) {{", t_.row));
    }
    r.kernel = k.str() + (per_thread ? "" : row_loop_open(G_, t_.row)) + body.str() + "  }\n}\n";
    std::string arglist;
    for (size_t i = 0; i < args.size(); ++i) arglist += (i ? ", " : "") + args[i];
    const LaunchConfig launch = launch_config(p_, Kernel{t_});
    r.launcher = fmt::format(
        "  if ({rows} > 0) {{  // {name}\n"
        "    const unsigned blocks = {blocks};\n"
        "    {name}<<<blocks, {threads}, 0, stream>>>({args});\n"
        "    if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;\n"
        "  }}\n",
        fmt::arg("rows", rows), fmt::arg("name", t_.name), fmt::arg("blocks", launch.x.expr(rows, "1")),
        fmt::arg("threads", launch.threads), fmt::arg("args", arglist));
    return r;
  }

 private:
  void line(const std::string& s) { w_->line(s); }

  const RegType& reg(const std::string& n) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it)
      if (auto f = it->find(n); f != it->end()) return f->second;
    throw std::logic_error("traversal printer: unknown register " + n);
  }

  const TensorInfo& tensor(const std::string& n) {
    const TensorInfo* t = p_.find(n);
    if (!t) throw std::logic_error("traversal printer: unknown tensor " + n);
    tensors_used_.insert(n);
    return *t;
  }

  // ---- instructions -------------------------------------------------------------------------------
  void block(const std::vector<Instr>& body) {
    for (const Instr& in : body) {
      std::visit(
          [&](const auto& x) {
            using T = std::decay_t<decltype(x)>;
            if constexpr (std::is_same_v<T, Comment>) line("// " + x.text);
            else if constexpr (std::is_same_v<T, IndexDef>) index(x);
            else if constexpr (std::is_same_v<T, Def>) def(x);
            else if constexpr (std::is_same_v<T, Update>) update(x);
            else if constexpr (std::is_same_v<T, Store>) store(x);
            else if constexpr (std::is_same_v<T, Sync>) line("__syncwarp();");
            else loop(x);
          },
          in.v);
    }
  }

  void index(const IndexDef& x) {
    if (auto f = fetched_.find(x.name); f != fetched_.end()) {  // fetched by its lane (fetched_loop)
      line(fmt::format("const {} {} = {};", index_type(x), x.name, f->second));
      return;
    }
    if (x.array == GraphArray::PairEtype) {  // the relation whose pairs hold row x.of: a search of pair_etype_ptr
      graph_used_.insert("pair_etype_ptr");
      uses_num_etypes_ = true;
      // A warp's lanes share its row: they search together (two rounds of one load for 535 relations). A thread
      // with a row of its own (one thread per row, a lane's own edge) searches alone.
      const char* search = split_ ? "segment_of" : "warp_segment_of";
      helpers_.insert(search);
      line(fmt::format("const int {} = {}(pair_etype_ptr, num_etypes, {});", x.name, search, x.of));
      return;
    }
    const char* array = to_string(x.array);
    graph_used_.insert(array);
    line(fmt::format("const {} {} = {}[{}];", index_type(x), x.name, array, x.of));
  }

  // The type a lane fetches an index into: the graph array's element (int32), a type id as an int.
  static const char* lane_type(const IndexDef& x) { return std::string_view(index_type(x)) == "int" ? "int" : "int32_t"; }

  // The C++ type of an index: a type id is an int, a row (node, edge, pair) an int64_t.
  static const char* index_type(const IndexDef& x) {
    switch (x.array) {
      case GraphArray::Etype:
      case GraphArray::InEtype:
      case GraphArray::OutEtype:
      case GraphArray::Ntype: return "int";
      default: return "int64_t";
    }
  }

  void loop(const EdgeLoop& l) {
    bool in = l.kind == inter::LoopKind::IncomingEdges;
    std::string ptr = in ? "in_ptr" : "out_ptr", eid = in ? "in_eid" : "out_eid";
    graph_used_.insert(ptr);
    if (!l.split && !split_ && fetchable(l.body)) return fetched_loop(l, ptr, eid);
    graph_used_.insert(eid);
    if (l.split) return split_loop(l, ptr, eid);
    if (G_ != 32) throw std::logic_error("traversal printer: row_lanes below 32 with a loop walked edge by edge in " + t_.name);
    line(fmt::format("for (int32_t {i} = {p}[{n}]; {i} < {p}[{n} + 1]; ++{i}) {{", fmt::arg("i", l.pos), fmt::arg("p", ptr),
                     fmt::arg("n", l.node)));
    {
      CodeWriter::Indent indent(*w_);
      line(fmt::format("const int64_t {} = {}[{}];", l.var, eid, l.pos));
      scopes_.emplace_back();
      block(l.body);
      scopes_.pop_back();
    }
    line("}");
  }

  // A loop the whole warp walks edge by edge, whose body holds no loop or sync: its edges come in blocks of 32,
  // lane l fetching the ids of edge first + l and the graph indices the body reads of it (its pair, relation,
  // source, ...: one coalesced load each instead of a chain of dependent loads per edge, which bounded the
  // node kernels by latency); each iteration takes them from that lane. The body is printed as before, in the
  // same edge order: the same results, bit for bit.
  static bool fetchable(const std::vector<Instr>& body) {
    for (const Instr& in : body)
      if (std::holds_alternative<EdgeLoop>(in.v) || std::holds_alternative<Sync>(in.v)) return false;
    return true;
  }

  // Whether a body without loops reads the edge (or node) `row` itself: an index of it, or a row of a tensor.
  static bool reads_row(const std::vector<Instr>& body, const std::string& row) {
    bool read = false;
    intra::for_each_instr(body, [&](const Instr& in) {
      if (auto* x = std::get_if<IndexDef>(&in.v)) read = read || x->of == row;
      if (auto* d = std::get_if<Def>(&in.v))
        if (auto* ld = std::get_if<Load>(&d->source)) read = read || ld->row == row;
      if (auto* st = std::get_if<Store>(&in.v)) read = read || st->row == row;
    });
    return read;
  }

  void fetched_loop(const EdgeLoop& l, const std::string& ptr, const std::string& eid) {
    const std::string first = unique_name(l.pos + "_first"), end = unique_name(l.pos + "_end"),
                      count = unique_name(l.pos + "_count"), j = unique_name(l.pos + "_j");
    printed_names_.insert({first, end, count, j});
    // The edge's id, when the body reads the edge itself (a body reading its rows and indices by CSR position alone
    // needs no in_eid), and the graph indices of the edge (or of one fetched before): every IndexDef of the body
    // but a pair's relation (a search the warp does together).
    const bool edge_read = reads_row(l.body, l.var);
    std::map<std::string, std::string> lane_of;
    if (edge_read) {
      graph_used_.insert(eid);
      lane_of[l.var] = unique_name(l.var + "_lane");
      printed_names_.insert(lane_of[l.var]);
    }
    std::vector<const IndexDef*> fetched;
    for (const Instr& in : l.body)
      if (auto* x = std::get_if<IndexDef>(&in.v); x && x->array != GraphArray::PairEtype &&
                                                  (x->of == l.pos || lane_of.count(x->of))) {
        lane_of[x->name] = unique_name(x->name + "_lane");
        printed_names_.insert(lane_of[x->name]);
        fetched.push_back(x);
      }
    // Scalars the body loads by the edge's CSR position (a graph-derived input in CSR order, in$norm): fetched by
    // the edge's lane too, one coalesced load for the block's edges instead of one load a step.
    std::vector<const Def*> fetched_values;
    for (const Instr& in : l.body)
      if (auto* d = std::get_if<Def>(&in.v))
        if (auto* ld = std::get_if<Load>(&d->source);
            ld && ld->row == l.pos && !ld->lane0 && d->type.numel() == 1 && d->type.layout == LaneLayout::Replicated) {
          lane_of[d->name] = unique_name(d->name + "_lane");
          printed_names_.insert(lane_of[d->name]);
          fetched_values.push_back(d);
        }
    // With rows of G < 32 lanes the warp's rows walk their edges in step: as many blocks and steps as its
    // longest row, a row's steps past its own edges commit nothing (`steps`: the block's steps, the same for the
    // warp; `count`: the row's own edges in the block).
    const bool in_step = G_ != 32;
    std::string steps = count, begin, todo, done;
    if (!in_step) {
      line(fmt::format("const int32_t {} = {}[{} + 1];", end, ptr, l.node));
      line(fmt::format("for (int32_t {f} = {p}[{n}]; {f} < {e}; {f} += 32) {{", fmt::arg("f", first), fmt::arg("p", ptr),
                       fmt::arg("n", l.node), fmt::arg("e", end)));
    } else {
      begin = unique_name(l.pos + "_begin"), todo = unique_name(l.pos + "_todo"), done = unique_name(l.pos + "_done");
      steps = unique_name(l.pos + "_steps");
      printed_names_.insert({begin, todo, done, steps});
      line(fmt::format("const int32_t {} = {}[{}];", begin, ptr, l.node));
      line(fmt::format("const int32_t {e} = row_live ? {p}[{n} + 1] : {b};  // a row past the last walks no edges",
                       fmt::arg("e", end), fmt::arg("p", ptr), fmt::arg("n", l.node), fmt::arg("b", begin)));
      line(fmt::format("const int {t} = __reduce_max_sync(0xffffffffu, {e} - {b});  // the warp's longest row", fmt::arg("t", todo),
                       fmt::arg("e", end), fmt::arg("b", begin)));
      line(fmt::format("for (int {d} = 0; {d} < {t}; {d} += {g}) {{", fmt::arg("d", done), fmt::arg("t", todo), fmt::arg("g", G_)));
    }
    {
      CodeWriter::Indent indent(*w_);
      if (!in_step) {
        line(fmt::format("const int {c} = {e} - {f} < 32 ? {e} - {f} : 32;", fmt::arg("c", count), fmt::arg("e", end),
                         fmt::arg("f", first)));
      } else {
        line(fmt::format("const int32_t {} = {} + {};", first, begin, done));
        line(fmt::format("const int {s} = {t} - {d} < {g} ? {t} - {d} : {g};", fmt::arg("s", steps), fmt::arg("t", todo),
                         fmt::arg("d", done), fmt::arg("g", G_)));
        line(fmt::format("const int {c} = {e} - {f} < {g} ? max({e} - {f}, 0) : {g};", fmt::arg("c", count), fmt::arg("e", end),
                         fmt::arg("f", first), fmt::arg("g", G_)));
      }
      if (edge_read || !fetched.empty() || !fetched_values.empty()) {
        line(fmt::format("// lane l fetches the indices of edge {} + l", first));
        // The lanes hold the graph arrays' int32 values (one register each, one shuffle); a step widens its row.
        if (edge_read) line(fmt::format("int32_t {} = 0;", lane_of[l.var]));
        for (const IndexDef* x : fetched) line(fmt::format("{} {} = 0;", lane_type(*x), lane_of[x->name]));
        for (const Def* d : fetched_values) line(fmt::format("float {} = 0.f;", lane_of[d->name]));
        line(fmt::format("if (lane < {}) {{", count));
        {
          CodeWriter::Indent in(*w_);
          if (edge_read) line(fmt::format("{} = {}[{} + lane];", lane_of[l.var], eid, first));
          for (const IndexDef* x : fetched) {
            const char* array = to_string(x->array);
            graph_used_.insert(array);
            std::string of = x->of == l.pos ? first + " + lane" : lane_of[x->of];
            line(fmt::format("{} = {}[{}];", lane_of[x->name], array, of));
          }
          for (const Def* d : fetched_values) {
            const TensorInfo& t = tensor(std::get<Load>(d->source).tensor);
            line(fmt::format("{} = {};", lane_of[d->name], load_elem(t, address(t, first + " + lane", "0"))));
          }
        }
        line("}");
      }
      // The iteration: the body first (into its own writer), to declare the position only where it reads it.
      // value_of(name): the edge's id or a fetched index in this iteration; position: the edge's place in the
      // CSR after the block's first; live_decl: in a batched step, the line declaring guard_ (printed if used).
      auto iteration = [&](const std::function<std::string(const std::string&)>& value_of, const std::string& position,
                           const std::string& live_decl) {
        CodeWriter body;
        CodeWriter* outer = std::exchange(w_, &body);
        std::map<std::string, std::string> outer_fetched = std::exchange(fetched_, {});
        for (const IndexDef* x : fetched) fetched_[x->name] = value_of(x->name);
        for (const Def* d : fetched_values) fetched_[d->name] = value_of(d->name);
        scopes_.emplace_back();
        block(l.body);
        scopes_.pop_back();
        fetched_ = std::move(outer_fetched);
        w_ = outer;
        if (!live_decl.empty() && std::regex_search(body.str(), std::regex("\\b" + guard_ + "\\b"))) line(live_decl);
        if (std::regex_search(body.str(), std::regex("\\b" + l.pos + "\\b")))
          line(fmt::format("const int32_t {} = {} + {};", l.pos, first, position));
        if (edge_read) line(fmt::format("const int64_t {} = {};", l.var, value_of(l.var)));
        w_->block(body.str());
      };
      auto shuffled = [&](const std::string& name) { return shfl(lane_of[name], j); };
      if (t_.edge_batch == 1) {
        line(fmt::format("for (int {j} = 0; {j} < {c}; ++{j}) {{", fmt::arg("j", j), fmt::arg("c", steps)));
        {
          CodeWriter::Indent in(*w_);
          if (!in_step) {
            iteration(shuffled, j, "");
          } else {
            const std::string live = unique_name(l.pos + "_live");
            printed_names_.insert(live);
            std::string outer_guard = std::exchange(guard_, live);
            iteration(shuffled, fmt::format("({} ? {} : 0)", live, j), fmt::format("const bool {} = {} < {};", live, j, count));
            guard_ = std::move(outer_guard);
          }
        }
        line("}");
      } else {
        // schedule.traversal.edge_batch b: the edges come b at a time. The indices of the b edges are shuffled
        // out first, then the b steps run unrolled with no branch or shuffle before their loads, so that the
        // loads of b edges are issued together instead of each waiting for the sums of the edge before. A step
        // past the last edge repeats the batch's first edge and commits nothing: its updates and stores are
        // guarded. Same edges, same order, the same sums.
        const int b = t_.edge_batch;
        const std::string j0 = unique_name(l.pos + "_j0"), u = unique_name(l.pos + "_u"),
                          live = unique_name(l.pos + "_live");
        printed_names_.insert({j0, u, live});
        std::map<std::string, std::string> batch_of;  // the edge id and each fetched index -> its batch's array
        std::vector<std::pair<std::string, const char*>> batched;
        if (edge_read) batched.emplace_back(l.var, "int64_t");
        for (const IndexDef* x : fetched) batched.emplace_back(x->name, index_type(*x));
        for (const Def* d : fetched_values) batched.emplace_back(d->name, "float");
        for (const auto& [name, type] : batched) {
          batch_of[name] = unique_name(name + "_batch");
          printed_names_.insert(batch_of[name]);
        }
        // The lane a step takes its indices from: past the row's last edge, the batch's first (G = 32), or the
        // lane itself, whose indices are 0 (rows in step: the batch may hold none of the row's edges).
        const std::string step = in_step ? fmt::format("{} + {}", j0, u)
                                         : fmt::format("{j0} + {u} < {c} ? {j0} + {u} : {j0}", fmt::arg("j0", j0),
                                                       fmt::arg("u", u), fmt::arg("c", count));
        const std::string position = in_step ? fmt::format("({j0} + {u} < {c} ? {j0} + {u} : 0)", fmt::arg("j0", j0),
                                                           fmt::arg("u", u), fmt::arg("c", count))
                                             : "(" + step + ")";
        line(fmt::format("for (int {j0} = 0; {j0} < {c}; {j0} += {b}) {{", fmt::arg("j0", j0), fmt::arg("c", steps),
                         fmt::arg("b", b)));
        {
          CodeWriter::Indent in(*w_);
          for (const auto& [name, type] : batched) line(fmt::format("{} {}[{}];", type, batch_of[name], b));
          line("#pragma unroll");
          line(fmt::format("for (int {u} = 0; {u} < {b}; ++{u}) {{", fmt::arg("u", u), fmt::arg("b", b)));
          {
            CodeWriter::Indent in2(*w_);
            line(fmt::format("const int {} = {};", j, step));
            for (const auto& [name, type] : batched) line(fmt::format("{}[{}] = {};", batch_of[name], u, shuffled(name)));
          }
          line("}");
          line("#pragma unroll");
          line(fmt::format("for (int {u} = 0; {u} < {b}; ++{u}) {{", fmt::arg("u", u), fmt::arg("b", b)));
          {
            CodeWriter::Indent in2(*w_);
            std::string outer_guard = std::exchange(guard_, live);
            iteration([&](const std::string& name) { return fmt::format("{}[{}]", batch_of[name], u); }, position,
                      fmt::format("const bool {} = {} + {} < {};", live, j0, u, count));
            guard_ = std::move(outer_guard);
          }
          line("}");
        }
        line("}");
      }
    }
    line("}");
  }

  // A loop whose iterations the lanes split (EdgeLoop::split): each lane walks every 32nd edge; a sum of
  // the enclosing scope collects the lane's share in a register of its own, a maximum in the register
  // itself (every lane starts from the same value), and both combine over the warp after the loop.
  void split_loop(const EdgeLoop& l, const std::string& ptr, const std::string& eid) {
    std::map<std::string, ReduceOp> acc;
    for (const Instr& in : l.body)
      if (auto* u = std::get_if<Update>(&in.v); u && !defined_in(l.body, u->name)) acc.emplace(u->name, accumulation(*u));
    std::map<std::string, std::string> shares;
    for (const auto& [x, op] : acc) {
      if (op != ReduceOp::Sum) continue;
      std::string share = unique_name(x + "_share");
      printed_names_.insert(share);  // a later split loop summing x declares another
      shares[x] = share;
      int64_t k = slots_of(reg(x));
      if (k == 1) line(fmt::format("float {} = 0.0f;", share));
      else line(fmt::format("float {}[{}] = {{}};", share, k));
    }
    line(fmt::format("// the lanes split the edges: lane l takes positions l, l + {0}, ...", G_));
    // (rows in step: a row past the last walks no edges)
    line(fmt::format("for (int32_t {i} = {p}[{n}] + lane; {live}{i} < {p}[{n} + 1]; {i} += {g}) {{", fmt::arg("i", l.pos),
                     fmt::arg("p", ptr), fmt::arg("n", l.node), fmt::arg("g", G_), fmt::arg("live", G_ == 32 ? "" : "row_live && ")));
    {
      CodeWriter::Indent indent(*w_);
      line(fmt::format("const int64_t {} = {}[{}];", l.var, eid, l.pos));
      scopes_.emplace_back();
      std::map<std::string, std::string> outer = std::exchange(share_of_, shares);
      split_ = true;
      block(l.body);
      split_ = false;
      share_of_ = std::move(outer);
      scopes_.pop_back();
    }
    line("}");
    for (const auto& [x, op] : acc) {
      bool sum = op == ReduceOp::Sum;
      const std::string across = across_lanes(op);
      const int64_t k = slots_of(reg(x));
      slots(k, [&](const std::string& j) {
        std::string a = k == 1 ? x : fmt::format("{}[{}]", x, j);
        if (!sum) return fmt::format("{} = {}({});", a, across, a);
        return fmt::format("{} += {}({});", a, across, k == 1 ? shares.at(x) : fmt::format("{}[{}]", shares.at(x), j));
      });
    }
  }

  static bool defined_in(const std::vector<Instr>& body, const std::string& name) {
    for (const Instr& in : body)
      if (auto* d = std::get_if<Def>(&in.v); d && d->name == name) return true;
    return false;
  }

  // `base`, or base with underscores appended, so that it names nothing else in the kernel.
  std::string unique_name(std::string base) const {
    std::set<std::string> taken;
    intra::for_each_instr(t_.body, [&](const Instr& in) {
      if (auto* d = std::get_if<Def>(&in.v)) taken.insert(d->name);
      else if (auto* x = std::get_if<IndexDef>(&in.v)) taken.insert(x->name);
      else if (auto* l = std::get_if<EdgeLoop>(&in.v)) taken.insert({l->var, l->pos});
    });
    taken.insert(t_.row);
    taken.insert(printed_names_.begin(), printed_names_.end());
    for (const TensorInfo& t : p_.tensors) taken.insert(t.name);
    while (taken.count(base) || is_kernel_reserved(base)) base += "_";
    return base;
  }

  // `body(j)` for every slot j of a register of `slots` slots: one statement, or an unrolled loop.
  void slots(int64_t n, const std::function<std::string(const std::string&)>& body) {
    if (n == 1) return line(body("0"));
    line("#pragma unroll");
    line(fmt::format("for (int j = 0; j < {}; ++j) {}", n, body("j")));
  }

  // The run length of `lanes` register type `t` (ir/intra/traversal.h, slot_vector).
  int run_of(const RegType& t) const { return slot_vector(t.numel(), slots_of(t), t_.vector); }

  // The element that slot `j` of this lane holds of a `lanes` register of type `t`: (lane + G (j / V)) V + j % V for
  // its runs of V (ir/intra/traversal.h), spelled as simply as V allows.
  std::string lane_element(const RegType& t, const std::string& j) const {
    const int v = run_of(t);
    const int64_t slots = slots_of(t);
    if (v == 1) return j == "0" ? "lane" : fmt::format("lane + {} * {}", G_, j);
    if (v == slots) return j == "0" ? fmt::format("lane * {}", v) : fmt::format("lane * {} + {}", v, j);
    return j == "0" ? fmt::format("lane * {}", v) : fmt::format("(lane + {} * ({} / {})) * {} + {} % {}", G_, j, v, v, j, v);
  }

  // The first element of run `r` of this lane (runs of `v` elements).
  std::string run_start(int v, int64_t runs, const std::string& r) const {
    if (runs == 1 || r == "0") return fmt::format("lane * {}", v);
    return fmt::format("(lane + {} * {}) * {}", G_, r, v);
  }

  // The lane (and its slot) that holds element `idx` of a `lanes` register of type `t`.
  std::string owner_lane(const RegType& t, const std::string& idx) const {
    const int v = run_of(t);
    return v == 1 ? fmt::format("{} % {}", atom(idx), G_) : fmt::format("{} / {} % {}", atom(idx), v, G_);
  }
  std::string owner_slot(const RegType& t, const std::string& idx) const {
    const int v = run_of(t);
    if (v == 1) return fmt::format("{} / {}", atom(idx), G_);
    if (v == slots_of(t)) return fmt::format("{} % {}", atom(idx), v);
    return fmt::format("{0} / {1} * {2} + {0} % {2}", atom(idx), G_ * v, v);
  }
  // `x` as an operand: a name as it is, anything else parenthesised.
  static std::string atom(const std::string& x) {
    auto letter = [](char ch) { return std::isalpha(static_cast<unsigned char>(ch)) || ch == '_'; };
    return !x.empty() && std::all_of(x.begin(), x.end(), letter) ? x : "(" + x + ")";
  }

  // Whether a `lanes` register of type `t` for a row of n elements moves in vector runs: runs of more than one
  // element that never straddle the row's end (n a multiple of the run), so each is whole in the row or past it.
  bool vector_runs(int64_t n, const RegType& t) const { return run_of(t) > 1 && n % run_of(t) == 0; }

  // Notes the helpers of vector runs of tensor `t`'s element type.
  void use_runs(const TensorInfo& t, bool store) {
    helpers_.insert("runs");
    helpers_.insert(std::string(store ? "runs_store_" : "runs_load_") + intra::cuda_type(t.storage));
  }

  // Registers per lane of a value of type `t` in this instance.
  int64_t slots_of(const RegType& t) const { return t.slots(G_); }

  std::string shfl(const std::string& v, const std::string& src) const { return row_shuffle(G_, v, src); }

  // The helper that sums (or maximises) a value over the row's lanes; notes it for the kernel file.
  std::string across_lanes(ReduceOp op) {
    const bool sum = op == ReduceOp::Sum;
    if (G_ == 32) {
      helpers_.insert(sum ? "warp_sum" : "warp_max");
      return sum ? "warp_sum" : "warp_max";
    }
    helpers_.insert(sum ? "group_sum" : "group_max");
    return fmt::format("{}<{}>", sum ? "group_sum" : "group_max", G_);
  }

  // The address of element `idx` of `row` of tensor `t`.
  static std::string address(const TensorInfo& t, const std::string& row, const std::string& idx) {
    int64_t n = t.row_numel();
    if (row == "0") return fmt::format("{}[{}]", t.name, idx);
    if (n == 1) return fmt::format("{}[{}]", t.name, row);
    return fmt::format("{}[{} * {} + {}]", t.name, row, n, idx);
  }

  void def(const Def& d) {
    print_def(d);
    scopes_.back()[d.name] = d.type;
  }

  void print_def(const Def& d) {
    const RegType& ty = d.type;
    int64_t s = slots_of(ty);
    const std::string& x = d.name;
    auto declare = [&](const std::string& value, bool constant) {
      if (s == 1) line(fmt::format("{}float {} = {};", constant ? "const " : "", x, value));
    };
    if (auto* l = std::get_if<Load>(&d.source)) {
      const TensorInfo& t = tensor(l->tensor);
      if (auto f = fetched_.find(x); f != fetched_.end()) return declare(f->second, !d.is_mutable);  // fetched_loop
      int64_t n = t.row_numel();
      auto elem = [&](const std::string& j) {
        if (ty.layout == LaneLayout::Replicated && l->lane0 && !split_)  // in a split loop the lane's own edge
          return shfl(fmt::format("lane == 0 ? {} : 0.f", load_elem(t, address(t, l->row, j))), "0");
        if (ty.layout == LaneLayout::Replicated) return load_elem(t, address(t, l->row, j));
        std::string idx = lane_element(ty, j);
        std::string a = load_elem(t, address(t, l->row, idx));
        return n % G_ ? fmt::format("{} < {} ? {} : 0.f", idx, n, a) : a;
      };
      if (s == 1) return declare(elem("0"), !d.is_mutable);
      line(fmt::format("float {}[{}];", x, s));
      if (ty.layout == LaneLayout::Lanes && vector_runs(n, ty)) {  // one vector load a run
        const int v = run_of(ty);
        const int64_t runs = s / v;
        use_runs(t, false);
        // Run r: a load, or past the row's end (a row of n elements not a multiple of G V) zeros.
        auto run = [&](const std::string& r) {
          const std::string first = run_start(v, runs, r), to = r == "0" ? x : fmt::format("{} + {} * {}", x, r, v);
          line(fmt::format("{}load_run<{}>({}, &{});", n % (G_ * v) ? fmt::format("if ({} < {}) ", first, n) : "", v, to,
                           address(t, l->row, first)));
          if (n % (G_ * v) == 0) return;
          const std::string slot = r == "0" ? "j" : fmt::format("{} * {} + j", r, v);
          line(fmt::format("else for (int j = 0; j < {}; ++j) {}[{}] = 0.f;", v, x, slot));
        };
        if (runs == 1) return run("0");
        line("#pragma unroll");
        line(fmt::format("for (int run = 0; run < {}; ++run) {{", runs));
        {
          CodeWriter::Indent in(*w_);
          run("run");
        }
        return line("}");
      }
      return slots(s, [&](const std::string& j) { return fmt::format("{}[{}] = {};", x, j, elem(j)); });
    }
    if (auto* e = std::get_if<Eval>(&d.source)) {
      if (s == 1) return declare(value(e->value, ty, "0").text, !d.is_mutable);
      line(fmt::format("float {}[{}];", x, s));
      return slots(s, [&](const std::string& j) { return fmt::format("{}[{}] = {};", x, j, value(e->value, ty, j).text); });
    }
    reduce(d, std::get<Reduce>(d.source));
  }

  // Reduces the last axis (`axis` elements) of the value: a sum (or max) of slots per lane, then over the
  // lanes when the value is spread over them.
  void reduce(const Def& d, const Reduce& r) {
    const RegType& out = d.type;
    int64_t m_count = out.numel(), n = m_count * r.axis, d_ = r.axis;
    bool sum = r.op == ReduceOp::Sum;
    std::string zero = sum ? "0.f" : "-INFINITY";
    auto acc = [&](const std::string& a, const std::string& v) {
      return sum ? fmt::format("{} += {};", a, v) : fmt::format("{} = fmaxf({}, {});", a, a, v);
    };
    const std::string& x = d.name;
    if (!r.warp) {  // every lane holds the whole value: reduce within the lane
      RegType it{{n}, LaneLayout::Replicated};
      if (m_count == 1) {
        line(fmt::format("float {} = {};", x, value(r.value, it, "0").text));
        if (d_ > 1) {
          line("#pragma unroll");
          line(fmt::format("for (int j = 1; j < {}; ++j) {}", d_, acc(x, value(r.value, it, "j").text)));
        }
        return;
      }
      line(fmt::format("float {}[{}];", x, m_count));
      line("#pragma unroll");
      line(fmt::format("for (int m = 0; m < {}; ++m) {{", m_count));
      line(fmt::format("  {}[m] = {};", x, value(r.value, it, fmt::format("m * {}", d_)).text));
      line("  #pragma unroll");
      line(fmt::format("  for (int j = 1; j < {}; ++j) {}", d_, acc(x + "[m]", value(r.value, it, fmt::format("m * {} + j", d_)).text)));
      line("}");
      return;
    }
    const std::string across = across_lanes(r.op);
    RegType it{{n}, LaneLayout::Lanes};
    int64_t s = slots_of(it);
    auto guarded = [&](const std::string& j, const std::string& cond, const std::string& a) {
      return cond.empty() ? acc(a, value(r.value, it, j).text) : fmt::format("if ({}) {}", cond, acc(a, value(r.value, it, j).text));
    };
    if (m_count == 1) {  // one warp-wide reduction
      std::string tail = n % G_ ? fmt::format("{} < {}", lane_element(it, "j"), n) : "";
      if (s == 1) {
        std::string v = value(r.value, it, "0").text;
        line(fmt::format("float {} = {};", x, n % G_ ? fmt::format("lane < {} ? {} : {}", n, v, zero) : v));
      } else {
        line(fmt::format("float {} = {};", x, zero));
        line("#pragma unroll");
        line(fmt::format("for (int j = 0; j < {}; ++j) {}", s, guarded("j", tail, x)));
      }
      line(fmt::format("{} = {}({});", x, across, x));
      return;
    }
    if (out.layout == LaneLayout::Replicated) {  // one warp-wide reduction per output element
      line(fmt::format("float {}[{}];", x, m_count));
      line("#pragma unroll");
      line(fmt::format("for (int m = 0; m < {}; ++m) {{  // one {}-wide reduction per output element", m_count, G_ == 32 ? "warp" : "row"));
      line(fmt::format("  float partial = {};", zero));
      line("  #pragma unroll");
      std::string cond = fmt::format("{}({}) / {} == m", n % G_ ? fmt::format("{} < {} && ", lane_element(it, "j"), n) : "",
                                     lane_element(it, "j"), d_);
      line(fmt::format("  for (int j = 0; j < {}; ++j) {}", s, guarded("j", cond, "partial")));
      line(fmt::format("  {}[m] = {}(partial);", x, across));
      line("}");
      return;
    }
    // The output is spread over the lanes too: output m is kept by its owner (lane m % G, in slot m / G, when
    // the lanes interleave); it reduces elements [m d, (m + 1) d): interleaved, slots m d / G .. ((m + 1) d - 1) / G,
    // else whichever slots hold them.
    const int64_t out_slots = slots_of(out);
    line(fmt::format("float {}[{}];", x, out_slots));
    slots(out_slots, [&](const std::string& j) { return fmt::format("{}[{}] = {};", x, j, zero); });
    line("#pragma unroll");
    line(fmt::format("for (int m = 0; m < {}; ++m) {{  // one {}-wide reduction per output element, kept by lane {}", m_count,
                     G_ == 32 ? "warp" : "row", owner_lane(out, "m")));
    line(fmt::format("  float partial = {};", zero));
    line("  #pragma unroll");
    const std::string in_m = guarded("j", fmt::format("({}) / {} == m", lane_element(it, "j"), d_), "partial");
    if (run_of(it) == 1) line(fmt::format("  for (int j = m * {0} / {2}; j <= (m * {0} + {1}) / {2}; ++j) {3}", d_, d_ - 1, G_, in_m));
    else line(fmt::format("  for (int j = 0; j < {}; ++j) {}", s, in_m));
    line(fmt::format("  const float total = {}(partial);", across));
    line(fmt::format("  if (lane == {}) {}[{}] = total;", owner_lane(out, "m"), x, owner_slot(out, "m")));
    line("}");
  }

  // Runs `print` (an update or a store), inside `if (guard_) { ... }` in a batched loop's step (fetched_loop):
  // a step past the last edge commits nothing.
  template <class F>
  void guarded_commit(F&& print) {
    if (guard_.empty()) return print();
    line(fmt::format("if ({}) {{", guard_));
    {
      CodeWriter::Indent in(*w_);
      print();
    }
    line("}");
  }

  void update(const Update& u) {
    guarded_commit([&] { print_update(u); });
  }

  void print_update(const Update& u) {
    const RegType& ty = reg(u.name);
    const char* op = inter::to_string(u.op);
    // In a split loop a sum of the enclosing scope adds to the lane's share.
    auto share = share_of_.find(u.name);
    const std::string& x = share == share_of_.end() ? u.name : share->second;
    if (slots_of(ty) == 1) return line(fmt::format("{} {} {};", x, op, value(u.value, ty, "0").text));
    slots(slots_of(ty), [&](const std::string& j) { return fmt::format("{}[{}] {} {};", x, j, op, value(u.value, ty, j).text); });
  }

  void store(const Store& s) {
    // Rows in step: a row past the last stores nothing (a step past its edges, guard_, is never one of its rows).
    if (G_ != 32 && guard_.empty()) {
      std::string outer = std::exchange(guard_, "row_live");
      guarded_commit([&] { print_store(s); });
      guard_ = std::move(outer);
      return;
    }
    guarded_commit([&] { print_store(s); });
  }

  void print_store(const Store& s) {
    const TensorInfo& t = tensor(s.tensor);
    written_.insert(s.tensor);
    const RegType& ty = reg(s.reg);
    int64_t n = t.row_numel(), k = slots_of(ty);
    auto put = [&](const std::string& idx, const std::string& j) {
      std::string v = k == 1 ? s.reg : fmt::format("{}[{}]", s.reg, j);
      std::string a = address(t, s.row, idx);
      return s.atomic ? fmt::format("atomicAdd(&{}, {});", a, v) : store_elem(t, a, v, false);  // atomics: fp32 only
    };
    if (s.lanes == StoreLanes::Lane0) {
      std::string who = split_ ? "" : "if (lane == 0) ";  // in a split loop: every lane, its own edge
      if (n == 1) return line(who + put("0", "0"));
      return line(fmt::format("{}for (int j = 0; j < {}; ++j) {}", who, n, put("j", "j")));
    }
    if (!s.atomic && ty.layout == LaneLayout::Lanes && k > 1 && vector_runs(n, ty)) {  // one vector store a run
      const int v = run_of(ty);
      const int64_t runs = k / v;
      use_runs(t, true);
      auto run = [&](const std::string& r) {
        const std::string first = run_start(v, runs, r);
        const std::string store = fmt::format("store_run<{}>(&{}, {});", v, address(t, s.row, first),
                                              r == "0" ? s.reg : fmt::format("{} + {} * {}", s.reg, r, v));
        return n % (G_ * v) == 0 ? store : fmt::format("if ({} < {}) {}", first, n, store);
      };
      if (runs == 1) return line(run("0"));
      line("#pragma unroll");
      return line(fmt::format("for (int run = 0; run < {}; ++run) {}", runs, run("run")));
    }
    slots(k, [&](const std::string& j) {
      std::string idx = lane_element(ty, j);
      return (n % G_ ? fmt::format("if ({} < {}) ", idx, n) : "") + put(idx, j);
    });
  }

  // ---- values -------------------------------------------------------------------------------------
  // Slot `j` of `v` evaluated for an instruction over `it` (the iteration type): operands with as many
  // elements share its slots; smaller ones broadcast (their element flat / inner, shuffled from the lane
  // that holds it when they are spread over the lanes).
  CExpr value(const ValueP& v, const RegType& it, const std::string& j) {
    switch (v->kind) {
      case Value::Kind::Const: {
        std::string s = float_literal(v->number);
        return CExpr{s, s[0] == '-' ? 3 : 4};
      }
      case Value::Kind::Reg: return operand(v->reg, it, j);
      case Value::Kind::Op: break;
    }
    // The operator as the operator table spells it in CUDA; operands parenthesised where the spelling
    // would bind them otherwise.
    const inter::OpInfo& info = inter::op_info(v->op);
    int p = binding(v->op);
    std::vector<std::string> args;
    for (size_t k = 0; k < v->args.size(); ++k) {
      CExpr a = value(v->args[k], it, j);
      bool parens = info.syntax == inter::Syntax::Infix ? (k == 0 ? a.prec < p : a.prec <= p)
                    : info.syntax == inter::Syntax::Prefix ? a.prec <= 3
                                                          : a.prec < 4 && !delimited(info.cuda, k);
      args.push_back(paren(a, parens));
    }
    std::string text = inter::spell(info.cuda, args);
    return CExpr{text, info.syntax == inter::Syntax::Call ? (primary(text) ? 4 : 0) : p};
  }

  // True when every use of argument k in the spelling stands alone between ( or , and ) or , (a function
  // argument, or already parenthesised).
  static bool delimited(std::string_view pattern, size_t k) {
    std::string hole = "{" + std::to_string(k) + "}";
    for (size_t at = pattern.find(hole); at != std::string_view::npos; at = pattern.find(hole, at + 1)) {
      size_t before = pattern.find_last_not_of(' ', at == 0 ? std::string_view::npos : at - 1);
      size_t after = pattern.find_first_not_of(' ', at + hole.size());
      if (at == 0 || before == std::string_view::npos || after == std::string_view::npos) return false;
      if ((pattern[before] != '(' && pattern[before] != ',') || (pattern[after] != ')' && pattern[after] != ',')) return false;
    }
    return true;
  }

  // True when `text` needs no parentheses as an operand: a name or number, a call, or parenthesised whole.
  static bool primary(const std::string& text) {
    size_t i = 0;
    while (i < text.size() && (std::isalnum(static_cast<unsigned char>(text[i])) || text[i] == '_' || text[i] == '.')) ++i;
    if (i == text.size()) return i > 0;
    if (text[i] != '(' && text[i] != '[') return false;
    int depth = 0;
    for (size_t k = i; k < text.size(); ++k) {
      if (text[k] == '(' || text[k] == '[') ++depth;
      if (text[k] == ')' || text[k] == ']') --depth;
      if (depth == 0 && k + 1 != text.size()) return false;
    }
    return depth == 0;
  }

  CExpr operand(const std::string& name, const RegType& it, const std::string& j) {
    const RegType& r = reg(name);
    if (r.numel() == it.numel()) return CExpr{slots_of(r) == 1 ? name : fmt::format("{}[{}]", name, j)};
    if (r.numel() == 1 && r.layout == LaneLayout::Replicated) return CExpr{name};
    int64_t inner = it.numel() / r.numel();
    // The flat index of slot j of `it`, then the element of `name` it reads.
    std::string flat;
    const int v = run_of(it);
    if (it.layout == LaneLayout::Replicated) flat = j;
    else if (inner % (G_ * v) == 0)  // every lane reads the same element: its runs lie in one group of `inner`
      flat = j == "0" ? "0" : v == 1 ? fmt::format("{} * {}", G_, j) : fmt::format("{} * ({} / {})", G_ * v, j, v);
    else flat = lane_element(it, j);
    std::string idx = flat == "0" ? "0" : fmt::format("{} / {}", flat.find(' ') == std::string::npos ? flat : "(" + flat + ")", inner);
    if (r.layout == LaneLayout::Replicated) return CExpr{fmt::format("{}[{}]", name, idx)};
    const int64_t r_slots = slots_of(r);
    std::string slot = r_slots == 1 ? name : fmt::format("{}[{}]", name, owner_slot(r, idx));
    return CExpr{shfl(slot, owner_lane(r, idx))};
  }

  const Program& p_;
  const TraversalInstance& t_;
  const int G_;  // lanes per row (t_.row_lanes)
  CodeWriter* w_ = nullptr;
  std::vector<std::map<std::string, RegType>> scopes_;
  std::set<std::string> graph_used_, tensors_used_, written_, helpers_;
  bool uses_num_etypes_ = false;  // a pair's relation is searched in pair_etype_ptr
  bool split_ = false;                           // printing the body of a split loop
  std::map<std::string, std::string> share_of_;  // in a split loop: a summed register -> the lane's share
  std::set<std::string> printed_names_;          // names the printer declared (the lanes' shares, fetched_loop's)
  std::map<std::string, std::string> fetched_;   // in a fetched loop: an index -> its value in this iteration (a
                                                 // shuffle from the lane that fetched it, or its batch's array)
  std::string guard_;                            // in a batched loop's step: whether it commits (a live edge)
};

}  // namespace

TraversalCode emit_traversal(const Program& p, const TraversalInstance& t) { return TraversalPrinter(p, t).run(); }

std::string row_loop_open(int row_lanes, const std::string& row) {
  if (row_lanes == 32)
    return fmt::format("  const int lane = threadIdx.x & 31;\n"
                       "  const int64_t first_row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;\n"
                       "  const int64_t row_stride = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;\n"
                       "  for (int64_t {0} = first_row; {0} < num_rows; {0} += row_stride) {{\n",
                       row);
  const int shift = row_lanes == 16 ? 4 : 3;
  return fmt::format(
      "  const int lane = threadIdx.x & {0};  // the lane within its row's {1}\n"
      "  const int row_group = (threadIdx.x & 31) >> {2};  // which of the warp's {3} rows\n"
      "  const int64_t first_row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> {2};\n"
      "  const int64_t row_stride = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> {2};\n"
      "  // The warp's {3} rows run in step (their lanes shuffle together): a row past the last repeats\n"
      "  // the last row and stores nothing.\n"
      "  for (int64_t warp_row = first_row - row_group; warp_row < num_rows; warp_row += row_stride) {{\n"
      "    const bool row_live = warp_row + row_group < num_rows;\n"
      "    const int64_t {4} = row_live ? warp_row + row_group : num_rows - 1;\n",
      row_lanes - 1, row_lanes, shift, 32 / row_lanes, row);
}

std::string row_shuffle(int row_lanes, const std::string& v, const std::string& src) {
  if (row_lanes == 32) return fmt::format("__shfl_sync(0xffffffffu, {}, {})", v, src);
  return fmt::format("__shfl_sync(0xffffffffu, {}, {}, {})", v, src, row_lanes);
}

std::string device_helpers(const std::set<std::string>& names) {
  std::string out;
  if (names.count("warp_sum"))
    out += "// Sum of `v` over the 32 lanes of the warp, returned to every lane.\n"
           "__device__ __forceinline__ float warp_sum(float v) {\n"
           "#pragma unroll\n"
           "  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);\n"
           "  return v;\n"
           "}\n";
  if (names.count("group_sum"))
    out += std::string(out.empty() ? "" : "\n") +
           "// Sum of `v` over each aligned group of kRowLanes lanes (a row's), returned to the group's lanes; the warp's\n"
           "// lanes all take part.\n"
           "template <int kRowLanes>\n"
           "__device__ __forceinline__ float group_sum(float v) {\n"
           "#pragma unroll\n"
           "  for (int offset = kRowLanes / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);\n"
           "  return v;\n"
           "}\n";
  if (names.count("group_max"))
    out += std::string(out.empty() ? "" : "\n") +
           "// Maximum of `v` over each aligned group of kRowLanes lanes (a row's), returned to the group's lanes; the\n"
           "// warp's lanes all take part.\n"
           "template <int kRowLanes>\n"
           "__device__ __forceinline__ float group_max(float v) {\n"
           "#pragma unroll\n"
           "  for (int offset = kRowLanes / 2; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));\n"
           "  return v;\n"
           "}\n";
  if (names.count("segment_of"))
    out += std::string(out.empty() ? "" : "\n") +
           "// The segment of `ptr` (count + 1 offsets) holding `row`: the last s with ptr[s] <= row.\n"
           "__device__ __forceinline__ int segment_of(const int32_t* __restrict__ ptr, int count, int64_t row) {\n"
           "  int lo = 0, hi = count - 1;\n"
           "  while (lo < hi) {\n"
           "    const int mid = (lo + hi + 1) / 2;\n"
           "    if (ptr[mid] <= row) lo = mid; else hi = mid - 1;\n"
           "  }\n"
           "  return lo;\n"
           "}\n";
  if (names.count("warp_segment_of"))
    out += std::string(out.empty() ? "" : "\n") +
           "// The segment of `ptr` (count + 1 offsets) holding `row`, the last s with ptr[s] <= row, found by the 32 lanes\n"
           "// of a warp together (all with the same row): each round the lanes compare 32 evenly spaced offsets of the\n"
           "// segments left and keep the last one <= row, so 535 segments take two rounds of one load each, not nine\n"
           "// dependent loads of a binary search.\n"
           "__device__ __forceinline__ int warp_segment_of(const int32_t* __restrict__ ptr, int count, int64_t row) {\n"
           "  const int lane = threadIdx.x & 31;\n"
           "  int lo = 0, span = count;  // the answer is in [lo, lo + span), and ptr[lo] <= row\n"
           "  while (span > 1) {\n"
           "    const int step = (span + 31) / 32;\n"
           "    const int s = lo + lane * step;\n"
           "    const unsigned below = __ballot_sync(0xffffffffu, s < lo + span && ptr[s] <= row);\n"
           "    const int end = lo + span;\n"
           "    lo += (31 - __clz(below)) * step;  // lane 0's offset is ptr[lo] <= row: `below` is never 0\n"
           "    span = min(step, end - lo);\n"
           "  }\n"
           "  return lo;\n"
           "}\n";
  if (names.count("runs")) {
    out += std::string(out.empty() ? "" : "\n") +
           "// A run of V consecutive elements of a row (a lane's slots of a traversal register) moved as words of up to\n"
           "// 16 bytes, converted to and from float; the address is a multiple of the run's size (the row length is a\n"
           "// multiple of V, the tensor starts 16-byte aligned: the host code checks).\n"
           "template <int kRunBytes> struct RunWord;\n"
           "template <> struct RunWord<4> { using type = uint32_t; };\n"
           "template <> struct RunWord<8> { using type = uint2; };\n"
           "template <> struct RunWord<16> { using type = uint4; };\n";
    // The conversions the kernels' runs use (an unused one would be an unused-function warning).
    for (const char* type : {"float", "__nv_bfloat16", "__half"}) {
      // (16-bit types: the storage conversions, to_float / from_float, of emit/cuda.cpp storage_helpers)
      const bool fp32 = type == std::string("float");
      const std::string to = fp32 ? "v" : "to_float(v)", from = fp32 ? "v" : fmt::format("from_float<{}>(v)", type);
      if (names.count(std::string("runs_load_") + type))
        out += fmt::format("__device__ __forceinline__ float run_to_float({} v) {{ return {}; }}\n", type, to);
      if (names.count(std::string("runs_store_") + type))
        out += fmt::format("__device__ __forceinline__ void run_from_float({}& e, float v) {{ e = {}; }}\n", type, from);
    }
    out += "template <int kRun, class RunElem>\n"
           "__device__ __forceinline__ void load_run(float* run_values, const RunElem* run_addr) {\n"
           "  constexpr int kRunBytes = kRun * sizeof(RunElem) < 16 ? kRun * sizeof(RunElem) : 16;\n"
           "  constexpr int kRunPer = kRunBytes / sizeof(RunElem);\n"
           "  using RunChunk = typename RunWord<kRunBytes>::type;\n"
           "#pragma unroll\n"
           "  for (int w = 0; w < kRun / kRunPer; ++w) {\n"
           "    const RunChunk run_word = reinterpret_cast<const RunChunk*>(run_addr)[w];\n"
           "    const RunElem* e = reinterpret_cast<const RunElem*>(&run_word);\n"
           "#pragma unroll\n"
           "    for (int i = 0; i < kRunPer; ++i) run_values[w * kRunPer + i] = run_to_float(e[i]);\n"
           "  }\n"
           "}\n"
           "template <int kRun, class RunElem>\n"
           "__device__ __forceinline__ void store_run(RunElem* run_addr, const float* run_values) {\n"
           "  constexpr int kRunBytes = kRun * sizeof(RunElem) < 16 ? kRun * sizeof(RunElem) : 16;\n"
           "  constexpr int kRunPer = kRunBytes / sizeof(RunElem);\n"
           "  using RunChunk = typename RunWord<kRunBytes>::type;\n"
           "#pragma unroll\n"
           "  for (int w = 0; w < kRun / kRunPer; ++w) {\n"
           "    RunChunk run_word;\n"
           "    RunElem* e = reinterpret_cast<RunElem*>(&run_word);\n"
           "#pragma unroll\n"
           "    for (int i = 0; i < kRunPer; ++i) run_from_float(e[i], run_values[w * kRunPer + i]);\n"
           "    reinterpret_cast<RunChunk*>(run_addr)[w] = run_word;\n"
           "  }\n"
           "}\n";
  }
  if (names.count("warp_max"))
    out += std::string(out.empty() ? "" : "\n") +
           "// Maximum of `v` over the 32 lanes of the warp, returned to every lane.\n"
           "__device__ __forceinline__ float warp_max(float v) {\n"
           "#pragma unroll\n"
           "  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));\n"
           "  return v;\n"
           "}\n";
  return out;
}

}  // namespace hectorgen::emit
