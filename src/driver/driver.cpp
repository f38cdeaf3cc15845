#include "driver/driver.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <ostream>
#include <sstream>

#include "driver/pipeline.h"
#include "driver/reference_io.h"

namespace hectorgen::driver {

std::optional<SourceFile> read_source(const std::string& path, std::ostream& err) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    err << fmt::format("hectorgen: error: cannot read '{}': {}\n", path, std::strerror(errno));
    return std::nullopt;
  }
  std::ostringstream text;
  text << in.rdbuf();
  return SourceFile(path, text.str());
}

int write_outputs(const OutputSet& files, const Options& opts, std::ostream& out, std::ostream& err) {
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

namespace {

// The error for a pass name that is not one, listing the valid ones.
bool check_pass_name(const std::string& option, const std::string& name, bool all_allowed, std::ostream& err) {
  if (name.empty() || is_pass_name(name) || (all_allowed && name == "all")) return true;
  std::string list;
  for (const auto& p : pass_names()) list += " " + p;
  err << fmt::format("hectorgen: error: unknown pass '{}' for {} (passes:{}{})\n", name, option, list,
                     all_allowed ? " all" : "");
  return false;
}

}  // namespace

int run(const Options& opts, std::ostream& out, std::ostream& err) {
  if (opts.verbose) spdlog::set_level(spdlog::level::debug);
  if (!check_pass_name("--print-ir-after", opts.print_ir_after, true, err) ||
      !check_pass_name("--run-pass", opts.run_pass, false, err))
    return 1;

  std::optional<SourceFile> spec = read_source(opts.spec_path, err);  // read
  if (!spec) return 1;
  if (!opts.run_pass.empty()) return run_pass(*spec, opts, out, err);

  if (!opts.reference_dir.empty()) {
    Diagnostics diags;
    std::optional<inter::Module> m = frontend(*spec, diags, opts, out);
    diags.render(err);
    if (!m) return 1;
    if (std::string e = run_reference(*m, opts.reference_dir); !e.empty()) {
      err << "hectorgen: error: reference: " << e << "\n";
      return 1;
    }
    return 0;
  }

  OutputSet files;
  if (int status = compile(*spec, opts, files, out, err); status != 0) return status;  // compile
  return write_outputs(files, opts, out, err);                                          // write
}

}  // namespace hectorgen::driver
