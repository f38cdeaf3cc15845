// hectorgen: compiles a relational GNN model spec into CUDA kernels, host stubs and a Python module.
#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <exception>
#include <iostream>

#include "driver/driver.h"

int main(int argc, char** argv) {
  spdlog::set_default_logger(spdlog::stderr_color_mt("hectorgen"));
  spdlog::set_pattern("hectorgen: %l: %v");
  spdlog::set_level(spdlog::level::warn);

  hectorgen::driver::Options opts;
  CLI::App app{"hectorgen: a compiler for relational graph neural networks (RGCN, RGAT, HGT) to CUDA"};
  app.set_version_flag("--version", std::string("hectorgen ") + HECTORGEN_VERSION);
  app.add_option("spec", opts.spec_path, "model spec (.yaml, .yml or .json); with --run-pass, printed inter IR")->required();
  app.add_option("-o,--output", opts.out_dir, "output directory ('-' or omitted: print to stdout)");
  app.add_option("--emit", opts.emit, "what to emit")->check(CLI::IsMember({"all", "inter-ir", "intra-ir"}));
  app.add_option("--print-ir-after", opts.print_ir_after,
                 "print the IR of every phase after a pass (or 'all') to stdout; passes: parse, inline-functions, "
                 "typecheck, reorder-linear, hoist-node-transforms, compact-materialization, autodiff, fuse-loops, lower, "
                 "recompute-gemms, drop-unread-twins, share-gemm-tiles (the last two over all of a module's programs)");
  app.add_option("--run-pass", opts.run_pass,
                 "read the input as printed inter IR, run only this pass on it and print the result (pass tests)");
  app.add_option("--phase", opts.phase, "with --run-pass: the phase of the input module (names lowered kernels)")
      ->check(CLI::IsMember({"forward", "forward_train", "backward"}));
  app.add_option("--reorder", opts.reorder,
                 "linear operator reordering, overriding the spec's options.reorder: on, off, or auto (where the FLOP "
                 "count says it pays)")
      ->check(CLI::IsMember({"on", "off", "auto"}));
  app.add_option("--materialization", opts.materialization,
                 "how edge values of a (source, edge type) pair are stored, overriding the spec's "
                 "options.materialization: vanilla (per edge), compact (once per unique pair) or auto (both programs "
                 "in one module, chosen per graph at prepare_graph from a cost model: docs/materialization.md)")
      ->check(CLI::IsMember({"vanilla", "compact", "auto"}));
  app.add_option("--recompute", opts.recompute,
                 "rematerialization, overriding the spec's options.recompute: the backward recomputes a saved per-edge "
                 "or per-pair GEMM result whose operands it has anyway, instead of the forward saving it: auto (where "
                 "that lowers the training step's estimated peak memory), on (always) or off (never)")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  app.add_option("--unified-inputs", opts.unified_inputs,
                 "inputs (per node) the generated code reads from unified tensors in pinned, GPU-mapped host memory, "
                 "as with the spec's 'placement: unified' (comma-separated names)")
      ->delimiter(',');
  app.add_option("--indexed-inputs", opts.indexed_inputs,
                 "inputs (per node) read through a node-to-row map <name>_rows (an extra argument of the op), as with "
                 "the spec's 'rows: indexed' (comma-separated names)")
      ->delimiter(',');
  app.add_option("--reference", opts.reference_dir,
                 "run the float64 CPU reference on DIR/meta.json (see driver/reference_io.h) instead of generating");
  app.add_flag("-v,--verbose", opts.verbose, "log pipeline steps and pass timing to stderr");
  app.add_flag("--verify-each", opts.verify_each, "verify the IR after every pass (on by default in debug builds)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : 1;
  }
  try {
    return hectorgen::driver::run(opts, std::cout, std::cerr);
  } catch (const std::exception& e) {
    std::cerr << "hectorgen: internal error: " << e.what() << "\n";
    return 2;
  } catch (...) {
    std::cerr << "hectorgen: internal error\n";
    return 2;
  }
}
