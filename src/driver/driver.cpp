#include "driver/driver.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>
#include <set>
#include <fstream>
#include <ostream>
#include <sstream>

#include "driver/reference_io.h"
#include "emit/emit.h"
#include "emit/printer.h"
#include "ir/inter/printer.h"
#include "ir/inter/verifier.h"
#include "ir/intra/launch.h"
#include "passes/passes.h"
#include "spec/loader.h"

namespace hectorgen::driver {

const std::vector<std::string>& pass_names() {
  static const std::vector<std::string> names = {"parse", "inline-functions", "verify", "fuse-loops", "autodiff", "lower"};
  return names;
}

namespace {

// Prints the IR after a pass when --print-ir-after names it (or "all"), and logs pass timing.
class PassLog {
 public:
  PassLog(const Options& o, std::ostream& log) : o_(o), log_(log) {}
  void after(const std::string& pass, const inter::Module& m, bool types = false) {
    auto now = std::chrono::steady_clock::now();
    spdlog::debug("pass {:<18} {:8.3f} ms", pass, std::chrono::duration<double, std::milli>(now - last_).count());
    last_ = now;
    if (o_.print_ir_after == pass || o_.print_ir_after == "all") {
      log_ << "# ---- IR after " << pass << " ----\n" << print(m, types);
    }
  }
  // With `types`, each assignment is annotated with the type of what it stores.
  static std::string print(const inter::Module& m, bool types) {
    if (!types) return inter::print_module(m);
    return inter::print_module(m, [](const inter::Stmt& s) -> std::string {
      return s.kind == inter::StmtKind::Assign && s.target->type.typed() ? s.target->type.str() : "";
    });
  }

 private:
  const Options& o_;
  std::ostream& log_;
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

}  // namespace

std::optional<inter::Module> frontend(const SourceFile& spec, Diagnostics& diags, const Options& opts,
                                      std::ostream& log) {
  PassLog passes(opts, log);
  auto parsed = spec::load_module(spec, diags);
  if (!parsed) return std::nullopt;
  passes.after("parse", *parsed);
  inter::Module m = passes::inline_functions(*parsed, diags);
  if (diags.has_errors()) return std::nullopt;
  passes.after("inline-functions", m);
  std::optional<inter::Module> typed = inter::typecheck(m, diags);
  if (!typed) return std::nullopt;
  passes.after("verify", *typed, /*types=*/true);
  return typed;
}

int run(const Options& opts, std::ostream& out, std::ostream& err) {
  if (opts.verbose) spdlog::set_level(spdlog::level::debug);
  if (!opts.print_ir_after.empty() && opts.print_ir_after != "all" &&
      std::find(pass_names().begin(), pass_names().end(), opts.print_ir_after) == pass_names().end()) {
    std::string list;
    for (const auto& p : pass_names()) list += " " + p;
    err << fmt::format("hectorgen: error: unknown pass '{}' for --print-ir-after (passes:{} all)\n", opts.print_ir_after, list);
    return 1;
  }
  std::ifstream in(opts.spec_path, std::ios::binary);
  if (!in) {
    err << fmt::format("hectorgen: error: cannot read '{}': {}\n", opts.spec_path, std::strerror(errno));
    return 1;
  }
  std::ostringstream text;
  text << in.rdbuf();
  SourceFile spec(opts.spec_path, text.str());

  Diagnostics diags;
  auto m = frontend(spec, diags, opts, out);
  diags.render(err);
  if (!m) return 1;

  if (!opts.reference_dir.empty()) {
    if (std::string e = run_reference(*m, opts.reference_dir); !e.empty()) {
      err << "hectorgen: error: reference: " << e << "\n";
      return 1;
    }
    return 0;
  }

  // ---- optimisation and lowering ---------------------------------------------------------------
  // Passes keep the IR typed; with --verify-each (and in debug builds) the verifier checks it after each.
  auto verified = [&](const char* pass, const char* phase, const inter::Module& module) {
    if (!opts.verify_each) return true;
    Diagnostics vd;
    if (inter::verify(module, vd)) return true;
    vd.render(err);
    err << "hectorgen: internal error: the " << phase << " IR does not verify after " << pass << "\n";
    return false;
  };
  PassLog passes(opts, out);
  inter::Module fused = passes::fuse_loops(*m);
  if (!verified("fuse-loops", "forward", fused)) return 2;
  passes.after("fuse-loops", fused, /*types=*/true);
  OutputSet files;
  files.add(m->decl.name + ".inter.ir", PassLog::print(fused, /*types=*/true));
  // ---- training: autodiff, then the same fusion and lowering for the training forward and backward ----
  std::optional<passes::TrainingModules> training;
  {
    Diagnostics ad_diags;
    training = passes::autodiff(*m, ad_diags);
    if (!training) {
      // Not differentiable yet: still generate inference code, and say why there is no training code.
      for (const auto& d : ad_diags.all())
        err << Diagnostics::format({Severity::Warning, d.loc, "no backward pass generated: " + d.message, d.kind});
    }
  }
  std::vector<std::pair<std::string, inter::Module>> phases = {{"forward", fused}};
  if (training) {
    if (!verified("autodiff", "forward_train", training->forward) || !verified("autodiff", "backward", training->backward))
      return 2;
    phases.push_back({"forward_train", passes::fuse_loops(training->forward)});
    phases.push_back({"backward", passes::fuse_loops(training->backward)});
    for (size_t i = 1; i < phases.size(); ++i)
      if (!verified("fuse-loops", phases[i].first.c_str(), phases[i].second)) return 2;
    std::string bw = PassLog::print(phases[2].second, /*types=*/false);
    files.add(m->decl.name + ".backward.inter.ir", bw);
    passes.after("autodiff", phases[2].second);
  }
  if (opts.emit != "inter-ir") {
    std::vector<intra::Program> programs;
    Diagnostics lower_diags;
    for (auto& [phase, module] : phases) {
      std::vector<std::string> saved = phase == "forward_train" ? training->saved : std::vector<std::string>{};
      auto program = passes::lower(module, lower_diags, phase, saved);  // checks the shape limits too
      if (!program) {
        if (phase == "forward") {
          lower_diags.render(err);
          return 1;
        }
        for (const auto& d : lower_diags.all())
          err << Diagnostics::format({Severity::Warning, d.loc, "backward: " + d.message, d.kind});
        lower_diags = Diagnostics{};
        err << "hectorgen: warning: no training code generated (the " << phase << " pass does not lower)\n";
        programs.resize(1);
        break;
      }
      if (std::string e = intra::verify_program(*program); !e.empty()) {
        err << "hectorgen: internal error: intra-operator IR (" << phase << "): " << e << "\n";
        return 2;
      }
      programs.push_back(std::move(*program));
    }
    lower_diags.render(err);
    // One preprocessing serves every phase: all share the union of their graph layouts.
    std::set<std::string> layouts;
    for (const auto& pr : programs) layouts.insert(pr.layouts.begin(), pr.layouts.end());
    for (auto& pr : programs) pr.layouts = layouts;
    if (opts.print_ir_after == "lower" || opts.print_ir_after == "all")
      for (const auto& pr : programs) out << "# ---- IR after lower (" << pr.phase << ") ----\n" << intra::print_program(pr);
    // Banners name the spec as given when relative (specs/rgat.yaml), by file name when absolute, so the
    // output does not depend on where the repository sits.
    std::filesystem::path spec_path(opts.spec_path);
    std::string shown = spec_path.is_absolute() ? spec_path.filename().string() : spec_path.lexically_normal().string();
    emit::EmitContext ctx{shown, HECTORGEN_VERSION};
    if (opts.emit == "intra-ir") {
      files = OutputSet{};
      files.add(m->decl.name + ".intra.ir", intra::print_programs(programs));
    } else {
      emit::emit_all(programs, ctx, files);
    }
  }

  if (opts.out_dir.empty() || opts.out_dir == "-") {
    for (const auto& [_, content] : files.files()) out << content;
    return 0;
  }
  if (std::string e = files.commit(opts.out_dir); !e.empty()) {
    err << "hectorgen: error: " << e << "\n";
    return 1;
  }
  spdlog::debug("wrote {} file(s) to {}", files.files().size(), opts.out_dir);
  return 0;
}

}  // namespace hectorgen::driver
