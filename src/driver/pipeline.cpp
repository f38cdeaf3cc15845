// The pipeline: frontend() and compile() list the passes in order, one line each, followed by
// `log.after(PASS, phases)`, which times the pass (-v), prints every phase when --print-ir-after names it and,
// with --verify-each, verifies every phase. A new pass is one line here plus its name in pass_names().
#include "driver/pipeline.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <ostream>
#include <set>
#include <sstream>
#include <stdexcept>

#include "dsl/parser.h"
#include "emit/emit.h"
#include "emit/names.h"
#include "ir/inter/printer.h"
#include "ir/inter/verifier.h"
#include "ir/intra/launch.h"
#include "ir/intra/parser.h"
#include "passes/passes.h"
#include "spec/loader.h"

namespace hectorgen::driver {

const std::vector<std::string>& pass_names() {
  static const std::vector<std::string> names = {"parse",          "inline-functions",      "typecheck",
                                                 "reorder-linear", "hoist-node-transforms", "compact-materialization",
                                                 "autodiff",       "fuse-loops",            "lower",
                                                 "recompute-gemms", "drop-unread-twins",    "share-gemm-tiles"};
  return names;
}

bool is_pass_name(const std::string& name) {
  return std::find(pass_names().begin(), pass_names().end(), name) != pass_names().end();
}

namespace {

constexpr int kUserError = 1;
constexpr int kInternalError = 2;

// The inter IR as text; typed modules annotate each assignment with the type of what it stores.
std::string print_inter(const inter::Module& m, bool types) {
  if (!types) return inter::print_module(m);
  return inter::print_module(m, [](const inter::Stmt& s) -> std::string {
    return s.kind == inter::StmtKind::Assign && s.target->type.typed() ? s.target->type.str() : "";
  });
}

// What happens after each pass: its time, the IR of every phase for --print-ir-after, the verifier.
class PassLog {
 public:
  PassLog(const Options& o, std::ostream& log, std::ostream& err) : o_(o), log_(log), err_(err) {}

  // Inter-IR phases. Returns false (after an internal error on `err`) when --verify-each finds a phase that
  // does not verify; `typed` is false before typecheck.
  // The program the following passes build ("" for a module's only one; "compact" for auto's second): printed
  // phases are <program>_<phase>.
  void set_program(const std::string& program) { program_ = program; }

  bool after(const std::string& pass, const std::vector<Phase>& phases, bool typed = true) {
    timed(pass, phases.size());
    for (const Phase& p : phases) {
      if (printing(pass)) log_ << banner(pass, shown(p.name)) << print_inter(p.module, typed);
      if (!typed || !o_.verify_each) continue;
      Diagnostics vd;
      if (inter::verify(p.module, vd)) continue;
      vd.render(err_);
      err_ << "hectorgen: internal error: the " << p.name << " IR does not verify after " << pass << "\n";
      return false;
    }
    last_ = std::chrono::steady_clock::now();  // printing and verifying are not the next pass's time
    return true;
  }
  // Intra-IR programs (after lower); they were verified by lower_phases.
  void after(const std::string& pass, const std::vector<intra::Program>& programs) {
    timed(pass, programs.size());
    if (printing(pass))
      for (const intra::Program& p : programs) log_ << banner(pass, shown(p.phase)) << intra::print_program(p);
    last_ = std::chrono::steady_clock::now();
  }

 private:
  std::string shown(const std::string& phase) const { return program_.empty() ? phase : program_ + "_" + phase; }
  bool printing(const std::string& pass) const { return o_.print_ir_after == pass || o_.print_ir_after == "all"; }
  static std::string banner(const std::string& pass, const std::string& phase) {
    return fmt::format("# ---- IR after {} ({}) ----\n", pass, phase);
  }
  void timed(const std::string& pass, size_t phases) {
    if (!is_pass_name(pass)) throw std::logic_error("pipeline: pass '" + pass + "' is missing from pass_names()");
    auto now = std::chrono::steady_clock::now();
    spdlog::debug("pass {:<18} {:8.3f} ms  ({} phase{})", pass,
                  std::chrono::duration<double, std::milli>(now - last_).count(), phases, phases == 1 ? "" : "s");
  }

  const Options& o_;
  std::ostream& log_;
  std::ostream& err_;
  std::string program_;
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

// parse, inline-functions, typecheck.
std::optional<inter::Module> run_frontend(const SourceFile& spec, Diagnostics& diags, PassLog& log) {
  std::optional<inter::Module> parsed = spec::load_module(spec, diags);
  if (!parsed) return std::nullopt;
  if (!emit::check_public_names(parsed->decl, diags)) return std::nullopt;  // names no generated module can carry
  log.after("parse", {{"forward", *parsed}}, /*typed=*/false);

  inter::Module inlined = passes::inline_functions(*parsed, diags);
  if (diags.has_errors()) return std::nullopt;
  log.after("inline-functions", {{"forward", inlined}}, /*typed=*/false);

  std::optional<inter::Module> typed = inter::typecheck(inlined, diags);
  if (!typed) return std::nullopt;
  log.after("typecheck", {{"forward", *typed}});
  return typed;
}

// Why a model has no training code, for the generated module's error when a parameter requires grad.
std::string reason(const Diagnostic& d) {
  return d.loc.valid() ? fmt::format("{} (spec line {})", d.message, d.loc.line) : d.message;
}

// autodiff adds the training forward and the backward after the forward; a model that cannot train keeps only
// the forward, with a warning saying why (also kept in `no_training`).
void add_training_phases(std::vector<Phase>& phases, std::vector<std::string>& saved, std::string& no_training,
                         std::ostream& err) {
  Diagnostics diags;
  std::optional<passes::TrainingModules> training = passes::autodiff(phases.front().module, diags);
  if (!training) {
    for (const auto& d : diags.all()) {
      err << Diagnostics::format({Severity::Warning, d.loc, "no backward pass generated: " + d.message, d.kind});
      if (no_training.empty()) no_training = reason(d);
    }
    return;
  }
  phases.push_back({"forward_train", std::move(training->forward)});
  phases.push_back({"backward", std::move(training->backward)});
  saved = std::move(training->saved);
}

// lower, for each phase. The forward must lower (else a user error); a training phase that does not drops the
// training code with a warning. Sets `status` on errors.
std::vector<intra::Program> lower_phases(const std::vector<Phase>& phases, const std::vector<std::string>& saved,
                                         std::string& no_training, std::ostream& err, int& status) {
  std::vector<intra::Program> programs;
  Diagnostics diags;
  for (const Phase& phase : phases) {
    const std::vector<std::string> none;
    std::optional<intra::Program> program =
        passes::lower(phase.module, diags, phase.name, phase.name == "forward_train" ? saved : none);  // checks shape limits too
    if (!program) {
      if (phase.name == "forward") {
        diags.render(err);
        status = kUserError;
        return {};
      }
      for (const auto& d : diags.all()) {
        err << Diagnostics::format({Severity::Warning, d.loc, "backward: " + d.message, d.kind});
        if (no_training.empty()) no_training = "the " + phase.name + " pass does not lower: " + reason(d);
      }
      diags = Diagnostics{};
      err << "hectorgen: warning: no training code generated (the " << phase.name << " pass does not lower)\n";
      programs.resize(1);
      break;
    }
    if (std::string e = intra::verify_program(*program); !e.empty()) {
      err << "hectorgen: internal error: intra-operator IR (" << phase.name << "): " << e << "\n";
      status = kInternalError;
      return {};
    }
    programs.push_back(std::move(*program));
  }
  diags.render(err);
  passes::unify_storage(programs);
  // One graph preprocessing serves every phase: all share the union of their graph layouts.
  std::set<std::string> layouts;
  for (const auto& p : programs) layouts.insert(p.layouts.begin(), p.layouts.end());
  for (auto& p : programs) p.layouts = layouts;
  return programs;
}

// --reorder overrides the spec's options.reorder.
inter::Reorder reorder_mode(const inter::Module& m, const Options& opts) {
  if (opts.reorder.empty()) return m.decl.options.reorder;
  return inter::parse_reorder(opts.reorder).value_or(m.decl.options.reorder);
}

// --materialization overrides the spec's options.materialization.
inter::Materialization materialization_mode(const inter::Module& m, const Options& opts) {
  if (opts.materialization.empty()) return m.decl.options.materialization;
  return inter::parse_materialization(opts.materialization).value_or(m.decl.options.materialization);
}

// --recompute overrides the spec's options.recompute (`spec`).
inter::Recompute recompute_mode(inter::Recompute spec, const Options& opts) {
  if (opts.recompute.empty()) return spec;
  return inter::parse_recompute(opts.recompute).value_or(spec);
}

const inter::Module* find_phase(const std::vector<Phase>& phases, const std::string& name) {
  for (const Phase& p : phases)
    if (p.name == name) return &p.module;
  return nullptr;
}

// --unified-inputs (--indexed-inputs): the named inputs get 'placement: unified' ('rows: indexed', which also
// drops their gradient), with the spec's checks. False on errors.
bool mark_inputs(inter::ModelDecl& decl, const std::vector<std::string>& names, bool indexed, Diagnostics& diags) {
  const char* option = indexed ? "--indexed-inputs" : "--unified-inputs";
  bool ok = true;
  for (const std::string& name : names) {
    auto it = std::find_if(decl.inputs.begin(), decl.inputs.end(), [&](const inter::TensorDecl& t) { return t.name == name; });
    std::string why;
    if (it == decl.inputs.end()) {
      std::string known;
      for (const auto& t : decl.inputs)
        if (t.from_graph.empty()) known += (known.empty() ? "" : ", ") + t.name;
      why = fmt::format("no input '{}' (the user inputs: {})", name, known.empty() ? "none" : known);
    } else if (!it->from_graph.empty()) {
      why = fmt::format("input '{}' is computed from the graph ('from_graph'), not given by the user", name);
    } else if (it->per != inter::Per::Node) {
      why = fmt::format("input '{}' is 'per: {}'; {} inputs are 'per: node'", name, inter::to_string(it->per),
                        indexed ? "indexed" : "unified");
    } else {
      if (indexed) {
        it->indexed_rows = true;
        it->requires_grad = false;  // read through a map: no gradient (docs/unified_tensor.md)
      } else {
        it->unified = true;
      }
      continue;
    }
    diags.error(decl.loc, "bad-value", fmt::format("{}: {}", option, why));
    ok = false;
  }
  return ok;
}

}  // namespace

std::optional<inter::Module> frontend(const SourceFile& spec, Diagnostics& diags, const Options& opts,
                                      std::ostream& log) {
  PassLog passes(opts, log, log);
  return run_frontend(spec, diags, passes);
}

namespace {

// The programs of one materialization: reorder-linear .. lower over the typed module. `label` names the program
// in the printed IR ("" for the module's only program; "compact" for auto's second one), and its inter IR files
// are <model>[.label].inter.ir and <model>[.label].backward.inter.ir. Returns the status (0: fine).
int build_program(const inter::Module& typed, inter::Materialization materialization, const std::string& label,
                  const Options& opts, PassLog& log, OutputSet& files, std::vector<intra::Program>& programs,
                  std::string& no_training, std::ostream& err) {
  log.set_program(label);
  const std::string model = typed.decl.name;
  const std::string infix = label.empty() ? "" : "." + label;
  // Before autodiff: the training forward and the backward inherit the reordering, the hoisted node transforms and
  // the compaction.
  std::vector<Phase> phases = {{"forward", passes::reorder_linear(typed, typed.decl.options.reorder)}};
  phases.front().module.decl.options.materialization = materialization;  // the printed IR says what ran
  if (!log.after("reorder-linear", phases)) return kInternalError;
  phases.front().module = passes::hoist_node_transforms(phases.front().module);
  if (!log.after("hoist-node-transforms", phases)) return kInternalError;
  phases.front().module = passes::compact_materialization(phases.front().module, materialization);
  if (!log.after("compact-materialization", phases)) return kInternalError;
  std::vector<std::string> saved;  // forward_train fields the backward reads
  add_training_phases(phases, saved, no_training, err);
  if (!log.after("autodiff", phases)) return kInternalError;

  for (Phase& p : phases) p.module = passes::fuse_loops(p.module);
  if (!log.after("fuse-loops", phases)) return kInternalError;

  files.add(model + infix + ".inter.ir", print_inter(phases.front().module, /*types=*/true));
  if (const inter::Module* backward = find_phase(phases, "backward"))
    files.add(model + infix + ".backward.inter.ir", print_inter(*backward, /*types=*/false));
  if (opts.emit == "inter-ir") return 0;

  int status = 0;
  programs = lower_phases(phases, saved, no_training, err, status);
  if (status != 0) return status;
  log.after("lower", programs);
  if (programs.size() == 3) {
    passes::recompute_gemms(programs[1], programs[2]);
    if (std::string e = intra::verify_program(programs[1]) + intra::verify_program(programs[2]); !e.empty()) {
      err << "hectorgen: internal error: intra-operator IR after recompute-gemms: " << e << "\n";
      return kInternalError;
    }
  }
  log.after("recompute-gemms", programs);
  return 0;
}

// materialization: auto's second program: its phases are compact_<phase> (its ops and Args structs follow), its
// kernels <model>_compact_<...> (the emitter still emits a kernel identical to one of the vanilla program once).
void name_compact_program(std::vector<intra::Program>& programs) {
  for (intra::Program& p : programs) {
    const std::string prefix = p.model + "_", compact = p.model + "_compact_";
    p.phase = "compact_" + p.phase;
    for (intra::Kernel& k : p.kernels)
      std::visit([&](auto& instance) {
        if (instance.name.rfind(prefix, 0) != 0)
          throw std::logic_error("pipeline: kernel '" + instance.name + "' does not start with '" + prefix + "'");
        instance.name = compact + instance.name.substr(prefix.size());
      }, k);
  }
}

}  // namespace

int compile(const SourceFile& spec, const Options& opts, OutputSet& files, std::ostream& ir_log, std::ostream& err) {
  PassLog log(opts, ir_log, err);
  Diagnostics diags;
  std::optional<inter::Module> typed = run_frontend(spec, diags, log);  // parse, inline-functions, typecheck
  diags.render(err);
  if (!typed) return kUserError;
  const std::string model = typed->decl.name;
  typed->decl.options.reorder = reorder_mode(*typed, opts);  // --reorder wins; the printed IR says what ran
  typed->decl.options.recompute = recompute_mode(typed->decl.options.recompute, opts);
  const inter::Materialization materialization = materialization_mode(*typed, opts);
  typed->decl.options.materialization = materialization;
  if (!mark_inputs(typed->decl, opts.unified_inputs, /*indexed=*/false, diags) ||
      !mark_inputs(typed->decl, opts.indexed_inputs, /*indexed=*/true, diags)) {
    diags.render(err);
    return kUserError;
  }
  if (typed->decl.options.compact_relations && materialization != inter::Materialization::Auto)
    err << Diagnostics::format({Severity::Warning, typed->decl.loc,
                                fmt::format("options.compact_relations is ignored: it chooses the relations of "
                                            "materialization: auto, and this module is {}",
                                            inter::to_string(materialization)),
                                "ignored-option"});

  // materialization: auto compiles the model twice, vanilla and compact, into one module that picks one per graph
  // (docs/materialization.md).
  const bool both = materialization == inter::Materialization::Auto;
  std::string no_training;  // why there is no training code, if there is none
  std::vector<intra::Program> programs;
  if (int status = build_program(*typed, both ? inter::Materialization::Vanilla : materialization, "", opts, log, files,
                                 programs, no_training, err);
      status != 0)
    return status;
  std::vector<intra::Program> compact;
  if (both) {
    std::string compact_no_training;
    if (int status = build_program(*typed, inter::Materialization::Compact, "compact", opts, log, files, compact,
                                   compact_no_training, err);
        status != 0)
      return status;
    if (compact.size() != programs.size() && opts.emit != "inter-ir") {
      // Training code for one program only: the module has none, since the choice between them must stay free.
      if (no_training.empty()) no_training = "the compact program: " + compact_no_training;
      err << "hectorgen: warning: no training code generated (materialization: auto needs it in both programs)\n";
      programs.resize(1);
      compact.resize(1);
    }
  }
  if (opts.emit == "inter-ir") return 0;
  // Module-wide passes: every program of the module reads one prepared graph.
  auto log_module = [&](const std::string& pass) {
    log.set_program("");
    log.after(pass, programs);
    if (compact.empty()) return;
    log.set_program("compact");
    log.after(pass, compact);
    log.set_program("");
  };
  passes::drop_unread_twins({&programs, &compact});
  log_module("drop-unread-twins");
  passes::share_gemm_tiles({&programs, &compact});
  for (const std::vector<intra::Program>* list : {&programs, &compact})
    for (const intra::Program& p : *list)
      if (std::string e = intra::verify_program(p); !e.empty()) {
        err << "hectorgen: internal error: intra-operator IR after share-gemm-tiles (" << p.phase << "): " << e << "\n";
        return kInternalError;
      }
  log_module("share-gemm-tiles");
  for (const std::vector<intra::Program>* list : {&programs, &compact})
    for (const intra::Program& p : *list)
      if (std::string input, why = intra::indexed_input_obstacle(p, &input); !why.empty()) {
        const inter::TensorDecl* d = typed->decl.find_input(input);
        Diagnostics unsupported;  // the front end's diagnostics are rendered already
        unsupported.error(d ? d->loc : typed->decl.loc, "unsupported", why);
        unsupported.render(err);
        return kUserError;
      }

  if (opts.emit == "intra-ir") {
    files = OutputSet{};
    name_compact_program(compact);
    for (intra::Program& p : compact) programs.push_back(std::move(p));
    files.add(model + ".intra.ir", intra::print_programs(programs));
    return 0;
  }
  // Banners name the spec as given when relative (specs/rgat.yaml), by file name when absolute, so the output
  // does not depend on where the repository sits.
  std::filesystem::path spec_path(spec.path());
  std::string shown = spec_path.is_absolute() ? spec_path.filename().string() : spec_path.lexically_normal().string();
  auto start = std::chrono::steady_clock::now();
  emit::EmitContext ctx{shown, HECTORGEN_VERSION, no_training};
  if (both) {
    ctx.auto_materialization = true;
    name_compact_program(compact);
    for (intra::Program& p : compact) programs.push_back(std::move(p));
  }
  emit::emit_all(programs, ctx, files);
  std::chrono::duration<double, std::milli> emit_time = std::chrono::steady_clock::now() - start;
  spdlog::debug("{:<23} {:8.3f} ms  ({} files)", "emit", emit_time.count(), files.files().size());
  return 0;
}

// recompute-gemms on printed intra IR (an .intra.ir file with the phases forward_train and backward, and others, left
// as they are): prints every phase after it.
int run_intra_pass(const SourceFile& ir, const Options& opts, std::ostream& out, std::ostream& err) {
  Diagnostics diags;
  std::optional<std::vector<intra::Program>> programs = intra::parse_programs(ir, diags);
  diags.render(err);
  if (!programs) return kUserError;
  auto phase = [&](const std::string& name) {
    auto it = std::find_if(programs->begin(), programs->end(), [&](const intra::Program& p) { return p.phase == name; });
    return it == programs->end() ? nullptr : &*it;
  };
  intra::Program* forward_train = phase("forward_train");
  intra::Program* backward = phase("backward");
  if (!forward_train || !backward) {
    err << "hectorgen: error: --run-pass=" << opts.run_pass << " needs the phases forward_train and backward\n";
    return kUserError;
  }
  forward_train->decl.options.recompute = recompute_mode(forward_train->decl.options.recompute, opts);
  passes::recompute_gemms(*forward_train, *backward);
  for (const intra::Program& p : *programs)
    if (std::string e = intra::verify_program(p); !e.empty()) {
      err << "hectorgen: internal error: intra-operator IR (" << p.phase << ") after " << opts.run_pass << ": " << e << "\n";
      return kInternalError;
    }
  out << intra::print_programs(*programs);
  return 0;
}

int run_pass(const SourceFile& ir, const Options& opts, std::ostream& out, std::ostream& err) {
  const std::string& pass = opts.run_pass;
  if (pass == "recompute-gemms") return run_intra_pass(ir, opts, out, err);
  Diagnostics diags;
  std::optional<inter::Module> m = dsl::parse_module(dsl::ProgramText{ir.text(), &ir, {}, {}}, diags);
  std::vector<Phase> phases;
  std::vector<intra::Program> programs;
  bool typed = true;
  if (m && (pass == "parse" || pass == "inline-functions")) {
    typed = false;
    if (pass == "inline-functions") m = passes::inline_functions(*m, diags);
    if (!diags.has_errors()) phases.push_back({"forward", std::move(*m)});
  } else if (m) {
    std::optional<inter::Module> t = inter::typecheck(*m, diags);
    if (t && pass == "typecheck") {
      phases.push_back({"forward", std::move(*t)});
    } else if (t && pass == "autodiff") {
      if (std::optional<passes::TrainingModules> tm = passes::autodiff(*t, diags)) {
        phases.push_back({"forward_train", std::move(tm->forward)});
        phases.push_back({"backward", std::move(tm->backward)});
      }
    } else if (t && pass == "reorder-linear") {
      phases.push_back({opts.phase, passes::reorder_linear(*t, reorder_mode(*t, opts))});
    } else if (t && pass == "hoist-node-transforms") {
      phases.push_back({opts.phase, passes::hoist_node_transforms(*t)});
    } else if (t && pass == "compact-materialization") {
      phases.push_back({opts.phase, passes::compact_materialization(*t, materialization_mode(*t, opts))});
    } else if (t && pass == "fuse-loops") {
      phases.push_back({opts.phase, passes::fuse_loops(*t)});
    } else if (t && pass == "lower") {
      std::optional<intra::Program> p = passes::lower(*t, diags, opts.phase);
      if (p) {  // lower checks the shape limits
        if (std::string e = intra::verify_program(*p); !e.empty()) {
          err << "hectorgen: internal error: intra-operator IR (" << opts.phase << "): " << e << "\n";
          return kInternalError;
        }
        programs.push_back(std::move(*p));
      }
    }
  }
  diags.render(err);
  if (diags.has_errors() || (phases.empty() && programs.empty())) return kUserError;

  Options quiet = opts;
  quiet.print_ir_after.clear();
  std::ostringstream none;
  if (!PassLog(quiet, none, err).after(pass, phases, typed)) return kInternalError;
  for (const Phase& p : phases)
    out << (phases.size() > 1 ? "# phase " + p.name + "\n" : "") << print_inter(p.module, typed);
  for (const intra::Program& p : programs) out << intra::print_program(p);
  return 0;
}

}  // namespace hectorgen::driver
