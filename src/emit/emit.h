// Emitters: from the intra-operator IR to the files of docs/generated_api.md.
#pragma once

#include <map>
#include <set>
#include <string>

#include "support/output.h"
#include "ir/intra/intra.h"

namespace hectorgen::emit {

struct EmitContext {
  std::string spec_name;  // as shown in banners (the spec's path as given)
  std::string version;
  // Why no training code was generated (the generation-time warning), for the module's error when a parameter
  // requires grad; empty when the model is trainable or no reason is known.
  std::string no_training_reason = {};
  // materialization: auto: the phases are the vanilla program's, then the compact program's (compact_forward, ...);
  // the module holds both and picks one per graph (docs/materialization.md).
  bool auto_materialization = false;
  // The runtime minor version the module's tensor-core instances need (0: none beyond the module's other needs);
  // emit_all sets it from the phases (tc_runtime_minor).
  int tc_runtime_minor = 0;
};

// The runtime minor version that the tensor-core instances of `phases` need: 7 where one mixes an fp32 and a 16-bit
// operand (widened as loaded) or a GEMM over one segment runs without tile offsets (tile_ptr null); else 0.
int tc_runtime_minor(const std::vector<intra::Program>& phases);

// materialization: auto: the phases of one of the two programs (`compact`: those named compact_<phase>).
std::vector<intra::Program> program_phases(const std::vector<intra::Program>& phases, bool compact);

// Adds every generated file for `p` to `out`: kernels (.cu/.h), host stubs, Python module, CMakeLists,
// manifest. Throws TemplateError/logic_error on internal inconsistencies (exit code 2).
// `phases` starts with the forward; when the model is trainable forward_train and backward follow.
void emit_all(const std::vector<intra::Program>& phases, const EmitContext& ctx, OutputSet& out);

// Individual emitters (used by emit_all and the tests).
std::string emit_kernels_cu(const std::vector<intra::Program>& phases, const EmitContext& ctx);
std::string emit_kernels_h(const std::vector<intra::Program>& phases, const EmitContext& ctx);
std::string emit_host_cpp(const std::vector<intra::Program>& phases, const EmitContext& ctx);
std::string emit_python(const std::vector<intra::Program>& phases, const EmitContext& ctx);
std::string emit_cmake(const intra::Program& p, const EmitContext& ctx);
std::string emit_manifest(const std::vector<intra::Program>& phases, const EmitContext& ctx);
std::string args_struct(const intra::Program& p);

// The ATen code (for the host function) of a PyTorch-fallback instance.
std::string emit_torch_block(const intra::Program& p, const intra::TorchInstance& t);

// Scratch memory one kernel instance needs for one call (split-K partials, per-call tile offsets, a transposed
// weight): the host code allocates it from PyTorch's caching allocator (no cudaMalloc, no host sync: a generated
// layer can be captured in a CUDA graph) and passes it in the Args struct; the launcher fills and reads it.
struct Workspace {
  std::string name;     // Args field and host variable (a C++ identifier, unique in the phase)
  std::string ctype;    // element type: "float", "int32_t", "__nv_bfloat16" or "__half"
  std::string numel;    // C++ expression of its element count over num_nodes, num_edges, num_etypes, num_ntypes
  std::string comment;  // what it holds
  std::string kernel;   // the instance it belongs to (its C++ name)
  std::string use;      // what that instance's launcher calls it: "tile_ptr", "w_t"
};
// The workspaces of every instance of `p` (with its C++ names: emit/names.h), in kernel order; their names
// are fresh in the scope of the phase's tensors, graph arrays, kernels and the reserved identifiers.
std::vector<Workspace> workspaces(const intra::Program& p);

// The backward op computes only the gradients its caller asks for (its grad_mask argument: bit i, the i-th of
// `results`, the op's outputs): for each kernel of `p`, the indices of the results it feeds. The host code runs a
// kernel, and allocates a tensor, only when one of them is asked for.
std::vector<std::set<size_t>> results_fed(const intra::Program& p, const std::vector<std::string>& results);

// Graph arrays (struct fields / op arguments) the program needs, in a fixed order.
std::vector<std::string> graph_arrays(const intra::Program& p);

// Element access in device code by storage type (intra::TensorInfo::storage): arithmetic is in float, so a 16-bit
// element is converted at its load (to_float) and at its store (from_float<T>); fp32 elements are used as they are.
// `load_elem` wraps the element expression; `store_elem` is the statement `lhs = value;` (or `lhs += value;`).
std::string load_elem(const intra::TensorInfo& t, const std::string& elem);
std::string store_elem(const intra::TensorInfo& t, const std::string& lhs, const std::string& value, bool add);
// The conversion helpers load_elem / store_elem use, for the storage types `types` holds ("" when only fp32).
std::string storage_helpers(const std::set<inter::DType>& types);
std::string capitalize(const std::string& s);

// The variables every file template's banner uses: version, spec, model.
std::map<std::string, std::string> banner_vars(const intra::Program& p, const EmitContext& ctx);

}  // namespace hectorgen::emit
