// GEMM microbenchmark for hectorgen's GEMM template (issue 8, items 2 and 4): segment GEMMs over type-sorted
// rows with gather/scatter lists, and their weight gradients, on graphs shaped like the thesis's datasets.
// Every (case, operation, implementation, dtype) is checked against a float64 reference on fresh random
// inputs with the output poisoned first, weight gradients are run twice and compared bit for bit, and then
// timed with CUDA events (median). See docs/gemm_template.md and bench/gemm/run.sh.
//
//   gemm_bench [--case NAME]... [--impls simt,tc,cute] [--dtypes fp32,tf32,bf16,fp16] [--budget SECONDS] [--csv FILE] [--seed N] [--skew S]
//   gemm_bench --check-only ...       the checks without the timings (what run.sh runs under compute-sanitizer)
//   gemm_bench --list                 the default case names, cheapest first
//   gemm_bench --table FILE.csv...    the summary table of earlier runs' CSV files (exit 1 if a row FAILed)
// Operations: fwd-store, fwd-scatter (atomics), fwd-sorted (deterministic: destination-sorted segment sum), wgrad.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common.cuh"
#include "hectorgen/simt_wgrad.cuh"
#include "cute_gemm.h"
#include "reference.cuh"
#include "simt.cuh"

namespace gemm_bench {
namespace {

// ---- cases --------------------------------------------------------------------------------------------------

// A relation-typed edge set: num_rows edges sorted by relation, gathering node features (num_nodes rows).
struct Case {
  const char* name;
  int num_segments;   // relations R
  int64_t num_rows;   // edges M
  int64_t num_nodes;  // rows of the gathered table
  int dim;            // K = N
  bool by_default = true;  // false: only with --case NAME (the small cases for compute-sanitizer)
};

// Thesis statistics (relations, edges, nodes) of the datasets whose edge GEMMs dominate; 128-wide variants of
// two of them. Cheapest first, so a run cut short by its budget still covers the small ones.
const Case kCases[] = {
    {"aifb", 104, 49'000, 7'300, 64},            {"fb15k", 474, 620'000, 15'000, 64},
    {"biokg-128", 51, 4'800'000, 94'000, 128},   {"am", 108, 5'700'000, 1'900'000, 64},
    {"am-128", 108, 5'700'000, 1'900'000, 128},  {"wikikg2", 535, 16'000'000, 2'500'000, 64},
    {"mag", 4, 21'000'000, 1'900'000, 64},
    {"tiny", 7, 5'000, 1'000, 64, false},        {"tiny-128", 5, 3'000, 800, 128, false},
};

struct Options {
  std::vector<std::string> cases;  // empty: all
  std::vector<std::string> impls = {"simt", "tc", "cute"};
  std::vector<std::string> dtypes = {"fp32", "tf32", "bf16", "fp16"};
  std::vector<std::string> tables;  // --table: print the summary of these CSV files and exit
  bool list = false;
  bool check_only = false;  // checks without timings (for compute-sanitizer)
  double budget_s = 210;           // wall-clock budget: later cases are skipped (and reported) past it
  std::string csv;
  uint64_t seed = 8;
  double skew = 1.2;  // segment sizes ~ 1 / rank^skew
};

Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "gemm_bench: %s needs a value\n", arg.c_str());
        std::exit(1);
      }
      return argv[++i];
    };
    if (arg == "--case") o.cases.push_back(value());
    else if (arg == "--impls" || arg == "--dtypes") {
      std::vector<std::string>& out = arg == "--impls" ? o.impls : o.dtypes;
      out.clear();
      std::string list = value();
      for (size_t begin = 0, end; begin <= list.size(); begin = end + 1) {
        end = std::min(list.find(',', begin), list.size());
        out.push_back(list.substr(begin, end - begin));
      }
    } else if (arg == "--table") o.tables.push_back(value());
    else if (arg == "--list") o.list = true;
    else if (arg == "--check-only") o.check_only = true;
    else if (arg == "--budget") o.budget_s = std::stod(value());
    else if (arg == "--csv") o.csv = value();
    else if (arg == "--seed") o.seed = std::stoull(value());
    else if (arg == "--skew") o.skew = std::stod(value());
    else {
      std::fprintf(stderr, "gemm_bench: unknown argument %s\n", arg.c_str());
      std::exit(1);
    }
  }
  return o;
}

// ---- device buffers and the graph ---------------------------------------------------------------------------

template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(int64_t count) : count_(count) {
    CUDA_CHECK(cudaMalloc(&ptr_, std::max<int64_t>(count, 1) * sizeof(T)));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    std::swap(ptr_, other.ptr_);
    std::swap(count_, other.count_);
    return *this;
  }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  T* get() const { return ptr_; }
  int64_t size() const { return count_; }
  void upload(const std::vector<T>& host) {
    CUDA_CHECK(cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(count_);
    CUDA_CHECK(cudaMemcpy(host.data(), ptr_, count_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  T* ptr_ = nullptr;
  int64_t count_ = 0;
};

constexpr int kFillBlocks = 4096;

// Skewed segment sizes (Zipf-like, in a seeded random order), one empty segment when R >= 8.
std::vector<int32_t> make_seg_ptr(const Case& c, const Options& o) {
  std::vector<double> weight(c.num_segments);
  for (int r = 0; r < c.num_segments; ++r) weight[r] = 1.0 / std::pow(r + 1.0, o.skew);
  std::mt19937_64 rng(o.seed);
  std::shuffle(weight.begin(), weight.end(), rng);
  if (c.num_segments >= 8) weight[c.num_segments / 2] = 0;
  const double total = std::accumulate(weight.begin(), weight.end(), 0.0);
  std::vector<int64_t> size(c.num_segments);
  int64_t assigned = 0;
  for (int r = 0; r < c.num_segments; ++r) assigned += size[r] = static_cast<int64_t>(c.num_rows * weight[r] / total);
  size[std::max_element(weight.begin(), weight.end()) - weight.begin()] += c.num_rows - assigned;
  std::vector<int32_t> ptr(c.num_segments + 1, 0);
  for (int r = 0; r < c.num_segments; ++r) ptr[r + 1] = static_cast<int32_t>(ptr[r] + size[r]);
  return ptr;
}

// Prefix sum of ceil(segment rows / rows_per_item): what the runtime's build_tile_ptr computes.
std::vector<int32_t> item_ptr(const std::vector<int32_t>& seg_ptr, int64_t rows_per_item) {
  std::vector<int32_t> ptr(seg_ptr.size(), 0);
  for (size_t r = 0; r + 1 < seg_ptr.size(); ++r) {
    ptr[r + 1] = static_cast<int32_t>(ptr[r] + (seg_ptr[r + 1] - seg_ptr[r] + rows_per_item - 1) / rows_per_item);
  }
  return ptr;
}

constexpr int kRefChunkRows = 2048;

struct Graph {
  Case c;
  std::vector<int32_t> seg_ptr_host;
  DeviceBuffer<int32_t> seg_ptr, src, dst, type, tile_simt, tile_tc, tile_cute, chunk_tc, chunk_ref;
  // destination-sorted order for fwd-sorted: dst_pos[e] = position of edge e (stable counting sort by dst),
  // dst_ptr[v] = first position of destination v (CSR, num_nodes + 1 entries)
  DeviceBuffer<int32_t> dst_pos, dst_ptr;
  DeviceBuffer<float> scale;
  int chunk_rows_tc = 0;
  int64_t max_chunks_tc = 0;
};

Graph make_graph(const Case& c, const Options& o) {
  Graph g;
  g.c = c;
  g.seg_ptr_host = make_seg_ptr(c, o);
  auto upload = [](const std::vector<int32_t>& host) {
    DeviceBuffer<int32_t> d(static_cast<int64_t>(host.size()));
    d.upload(host);
    return d;
  };
  g.seg_ptr = upload(g.seg_ptr_host);
  g.tile_simt = upload(item_ptr(g.seg_ptr_host, simt::kTile));
  g.tile_tc = upload(item_ptr(g.seg_ptr_host, tc::kForwardTileRows));
  g.tile_cute = upload(item_ptr(g.seg_ptr_host, cute_impl::kTileRows));
  const int dw_tiles = (c.dim / 64) * (c.dim / 64);
  g.chunk_rows_tc = tc::wgrad_chunk_rows(c.num_rows, dw_tiles);
  g.max_chunks_tc = tc::wgrad_max_chunks(c.num_rows, c.num_segments, g.chunk_rows_tc);
  g.chunk_tc = upload(item_ptr(g.seg_ptr_host, g.chunk_rows_tc));
  g.chunk_ref = upload(item_ptr(g.seg_ptr_host, kRefChunkRows));
  g.src = DeviceBuffer<int32_t>(c.num_rows);
  g.dst = DeviceBuffer<int32_t>(c.num_rows);
  g.type = DeviceBuffer<int32_t>(c.num_rows);
  g.scale = DeviceBuffer<float>(c.num_rows);
  ref::fill_index<<<kFillBlocks, 256>>>(g.src.get(), c.num_rows, o.seed * 16 + 1, static_cast<int32_t>(c.num_nodes));
  ref::fill_index<<<kFillBlocks, 256>>>(g.dst.get(), c.num_rows, o.seed * 16 + 2, static_cast<int32_t>(c.num_nodes));
  ref::fill_uniform<<<kFillBlocks, 256>>>(g.scale.get(), c.num_rows, o.seed * 16 + 3, 0.1f, 1.0f);
  ref::row_types<<<kFillBlocks, 256>>>(g.seg_ptr.get(), c.num_segments, g.type.get(), c.num_rows);
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaDeviceSynchronize());
  // Preprocessing of the destination-sorted scatter (like tile_ptr: once per graph, not timed).
  const std::vector<int32_t> dst = g.dst.download();
  std::vector<int32_t> ptr(c.num_nodes + 1, 0), pos(c.num_rows);
  for (int32_t v : dst) ++ptr[v + 1];
  for (int64_t v = 0; v < c.num_nodes; ++v) ptr[v + 1] += ptr[v];
  std::vector<int32_t> next(ptr.begin(), ptr.end() - 1);
  for (int64_t e = 0; e < c.num_rows; ++e) pos[e] = next[dst[e]]++;
  g.dst_ptr = upload(ptr);
  g.dst_pos = upload(pos);
  return g;
}

// ---- results ------------------------------------------------------------------------------------------------

struct Row {
  std::string case_name, op, impl, dtype;
  double ms = NAN, gflops = NAN, gbs = NAN, floor_ms = NAN, rel_err = NAN, bandwidth_gbs = NAN;
  std::string status;  // ok, FAIL (error over tolerance, non-finite output, or not deterministic), SKIP
  std::string note;
};

struct Context {
  Options options;
  double bandwidth_gbs = 0;  // measured device-to-device copy bandwidth, bytes read + written
  std::vector<Row> rows;
  FILE* csv = nullptr;  // rows are appended as they finish, so a crash keeps the finished ones
  bool enabled(const char* impl) const {
    return std::find(options.impls.begin(), options.impls.end(), impl) != options.impls.end();
  }
  bool enabled(Dtype d) const {
    return std::find(options.dtypes.begin(), options.dtypes.end(), dtype_name(d)) != options.dtypes.end();
  }
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  double elapsed_s() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
};

void print_row(const Row& r) {
  std::printf("  %-10s %-11s %-5s %-5s %9.3f ms %8.0f GFLOP/s %7.0f GB/s  floor %7.3f ms (x%5.2f)  err %.2e  %s %s\n",
              r.case_name.c_str(), r.op.c_str(), r.impl.c_str(), r.dtype.c_str(), r.ms, r.gflops, r.gbs,
              r.floor_ms, r.ms / r.floor_ms, r.rel_err, r.status.c_str(), r.note.c_str());
  std::fflush(stdout);
}

void open_csv(Context& ctx) {
  if (ctx.options.csv.empty()) return;
  ctx.csv = std::fopen(ctx.options.csv.c_str(), "w");
  if (!ctx.csv) {
    std::fprintf(stderr, "gemm_bench: cannot write %s\n", ctx.options.csv.c_str());
    std::exit(1);
  }
  std::fprintf(ctx.csv, "case,op,impl,dtype,ms,gflops,gbs,floor_ms,ratio_to_floor,rel_err,status,note,copy_gbs\n");
  std::fflush(ctx.csv);
}

void append_csv(Context& ctx, const Row& r) {
  if (!ctx.csv) return;
  std::fprintf(ctx.csv, "%s,%s,%s,%s,%.5f,%.1f,%.1f,%.5f,%.3f,%.3e,%s,%s,%.0f\n", r.case_name.c_str(), r.op.c_str(),
               r.impl.c_str(), r.dtype.c_str(), r.ms, r.gflops, r.gbs, r.floor_ms, r.ms / r.floor_ms, r.rel_err,
               r.status.c_str(), r.note.c_str(), r.bandwidth_gbs);
  std::fflush(ctx.csv);
}

// Median of per-launch CUDA-event times; prepare() runs before each launch, outside the timed region.
double time_median_ms(const std::function<void()>& prepare, const std::function<void()>& launch) {
  cudaEvent_t begin, end;
  CUDA_CHECK(cudaEventCreate(&begin));
  CUDA_CHECK(cudaEventCreate(&end));
  auto once = [&]() {
    prepare();
    CUDA_CHECK(cudaEventRecord(begin));
    launch();
    CUDA_CHECK(cudaEventRecord(end));
    CUDA_CHECK(cudaEventSynchronize(end));
    CUDA_CHECK(cudaGetLastError());
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, begin, end));
    return static_cast<double>(ms);
  };
  once();  // warm-up
  const double first = once();
  const int reps = std::clamp(static_cast<int>(250.0 / std::max(first, 1e-3)), 3, 50);
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) times.push_back(once());
  std::sort(times.begin(), times.end());
  CUDA_CHECK(cudaEventDestroy(begin));
  CUDA_CHECK(cudaEventDestroy(end));
  return times[times.size() / 2];
}

double measure_bandwidth_gbs() {
  const int64_t bytes = int64_t{1} << 30;
  DeviceBuffer<char> a(bytes), b(bytes);
  CUDA_CHECK(cudaMemset(a.get(), 1, bytes));
  const double ms = time_median_ms([] {}, [&] {
    CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice));
  });
  return 2.0 * bytes / (ms * 1e-3) / 1e9;
}

// Relative float64 error from the device sums written by the check kernels.
struct ErrorSums {
  DeviceBuffer<double> sums{3};
  void reset() { CUDA_CHECK(cudaMemset(sums.get(), 0, 3 * sizeof(double))); }
  // returns the relative error; bad counts non-finite outputs
  double read(double& bad) const {
    const std::vector<double> h = sums.download();
    bad = h[2];
    return h[1] > 0 ? std::sqrt(h[0] / h[1]) : std::sqrt(h[0]);
  }
};

// ---- one dtype of one case ----------------------------------------------------------------------------------

enum class Op { kGatherStore, kGatherScatterAdd, kGatherSorted, kWgrad };
const char* op_name(Op op) {
  switch (op) {
    case Op::kGatherStore: return "fwd-store";
    case Op::kGatherScatterAdd: return "fwd-scatter";
    case Op::kGatherSorted: return "fwd-sorted";
    case Op::kWgrad: return "wgrad";
  }
  return "?";
}

// Relative error vs float64 (issue 8); fp32 gradients get 1e-4 like tools/gpu_check.sh: their reductions run
// over up to millions of rows.
double tolerance(Dtype d, Op op) {
  switch (d) {
    case Dtype::kFp32: return op == Op::kWgrad ? 1e-4 : 1e-5;
    case Dtype::kTf32: return 2e-3;
    default: return 2e-2;
  }
}

template <class T>
struct Inputs {
  DeviceBuffer<T> x, w, dy;
};

template <class T>
class DtypeRun {
 public:
  DtypeRun(Context& ctx, const Graph& g, Dtype dtype, uint64_t seed) : ctx_(ctx), g_(g), dtype_(dtype) {
    const Case& c = g.c;
    in_.x = DeviceBuffer<T>(c.num_nodes * c.dim);
    in_.w = DeviceBuffer<T>(static_cast<int64_t>(c.num_segments) * c.dim * c.dim);
    in_.dy = DeviceBuffer<T>(c.num_nodes * c.dim);
    const float w_range = 1.0f / std::sqrt(static_cast<float>(c.dim));
    ref::fill_uniform<<<kFillBlocks, 256>>>(in_.x.get(), in_.x.size(), seed * 16 + 5, -1.f, 1.f);
    ref::fill_uniform<<<kFillBlocks, 256>>>(in_.w.get(), in_.w.size(), seed * 16 + 6, -w_range, w_range);
    ref::fill_uniform<<<kFillBlocks, 256>>>(in_.dy.get(), in_.dy.size(), seed * 16 + 7, -1.f, 1.f);
    CUDA_CHECK(cudaGetLastError());
  }

  // ---- forward, direct store: Y[row] = scale[row] * X[src[row]] * W[type] ----
  template <class Launch>
  void gather_store(const char* impl, const int32_t* tile_ptr, Launch launch) {
    using OutT = std::conditional_t<std::is_same_v<T, float>, float, T>;
    const Case& c = g_.c;
    DeviceBuffer<OutT> y(c.num_rows * c.dim);
    SegmentGemmArgs<T, OutT> a{in_.x.get(), in_.w.get(), y.get(), g_.src.get(), nullptr, g_.scale.get(),
                               g_.seg_ptr.get(), tile_ptr, c.num_rows, c.num_segments};
    Row r = start_row(Op::kGatherStore, impl);
    ref::poison(y.get(), y.size(), nullptr);
    launch(a);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaDeviceSynchronize());
    errors_.reset();
    ref::check_direct<<<kFillBlocks, 256>>>(in_.x.get(), in_.w.get(), y.get(), g_.src.get(), g_.scale.get(),
                                            g_.type.get(), c.num_rows, c.dim, c.dim, errors_.sums.get());
    CUDA_CHECK(cudaGetLastError());
    finish_check(r, Op::kGatherStore);
    r.ms = ctx_.options.check_only ? NAN : time_median_ms([] {}, [&] { launch(a); });
    const double es = sizeof(T), out_es = sizeof(OutT);
    const double lists = 8.0 * c.num_rows;  // gather list + scale
    const double w_bytes = es * c.num_segments * c.dim * c.dim;
    finish_row(r, es * c.num_nodes * c.dim + w_bytes + lists + out_es * c.num_rows * c.dim,
               es * c.num_rows * c.dim + w_bytes + lists + out_es * c.num_rows * c.dim);
  }

  // ---- forward, scatter-add: Y[dst[row]] += scale[row] * X[src[row]] * W[type] (fp32 Y, atomics) ----
  template <class Launch>
  void gather_scatter_add(const char* impl, const int32_t* tile_ptr, Launch launch) {
    const Case& c = g_.c;
    ensure_scatter_reference();
    DeviceBuffer<float> y(c.num_nodes * c.dim);
    SegmentGemmArgs<T, float> a{in_.x.get(), in_.w.get(), y.get(), g_.src.get(), g_.dst.get(), g_.scale.get(),
                                g_.seg_ptr.get(), tile_ptr, c.num_rows, c.num_segments};
    Row r = start_row(Op::kGatherScatterAdd, impl);
    auto zero = [&] { CUDA_CHECK(cudaMemsetAsync(y.get(), 0, y.size() * sizeof(float))); };
    zero();  // an accumulation: its contract starts from zero, so no poison here
    launch(a);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaDeviceSynchronize());
    errors_.reset();
    ref::compare<<<kFillBlocks, 256>>>(y.get(), ref_scatter_.get(), y.size(), errors_.sums.get());
    CUDA_CHECK(cudaGetLastError());
    finish_check(r, Op::kGatherScatterAdd);
    r.ms = ctx_.options.check_only ? NAN : time_median_ms(zero, [&] { launch(a); });
    const double es = sizeof(T);
    const double lists = 12.0 * c.num_rows;  // gather, scatter, scale
    const double w_bytes = es * c.num_segments * c.dim * c.dim;
    const double out_bytes = 4.0 * c.num_nodes * c.dim;
    finish_row(r, es * c.num_nodes * c.dim + w_bytes + lists + out_bytes,
               es * c.num_rows * c.dim + w_bytes + lists + 4.0 * c.num_rows * c.dim);
  }

  // ---- forward, deterministic scatter-add (tc_gemm.cuh, "destination-sorted segment sum"): the store GEMM
  // writes each edge's row to E[dst_pos[row]], then Y[v] = sum of E[dst_ptr[v] .. dst_ptr[v + 1]) in order.
  // Same result contract as fwd-scatter (fp32 Y, the same float64 reference) but Y is overwritten (poisoned
  // first), and two runs must be bit-identical.
  template <class Launch>
  void gather_sorted(const char* impl, const int32_t* tile_ptr, Launch launch_gemm) {
    const Case& c = g_.c;
    ensure_scatter_reference();
    DeviceBuffer<T> e(c.num_rows * c.dim);  // the per-edge rows, destination-sorted (a reused workspace)
    DeviceBuffer<float> y(c.num_nodes * c.dim);
    SegmentGemmArgs<T, T> a{in_.x.get(), in_.w.get(), e.get(), g_.src.get(), g_.dst_pos.get(), g_.scale.get(),
                            g_.seg_ptr.get(), tile_ptr, c.num_rows, c.num_segments};
    const int32_t* const dst_ptr = g_.dst_ptr.get();
    auto launch = [&] {
      launch_gemm(a);
      if (c.dim == 64) tc::launch_csr_segment_sum<T, 64>(e.get(), dst_ptr, y.get(), c.num_nodes, nullptr);
      else tc::launch_csr_segment_sum<T, 128>(e.get(), dst_ptr, y.get(), c.num_nodes, nullptr);
    };
    Row r = start_row(Op::kGatherSorted, impl);
    ref::poison(e.get(), e.size(), nullptr);
    ref::poison(y.get(), y.size(), nullptr);
    launch();
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> first = y.download();
    errors_.reset();
    ref::compare<<<kFillBlocks, 256>>>(y.get(), ref_scatter_.get(), y.size(), errors_.sums.get());
    CUDA_CHECK(cudaGetLastError());
    finish_check(r, Op::kGatherSorted);
    ref::poison(e.get(), e.size(), nullptr);
    ref::poison(y.get(), y.size(), nullptr);
    launch();
    CUDA_CHECK(cudaGetLastError());
    const std::vector<float> second = y.download();
    const bool same = std::memcmp(first.data(), second.data(), first.size() * sizeof(float)) == 0;
    r.note += same ? "bit-identical x2" : "NOT DETERMINISTIC";
    if (!same) r.status = "FAIL";
    r.ms = ctx_.options.check_only ? NAN : time_median_ms([] {}, launch);
    const double es = sizeof(T);
    const double lists = 12.0 * c.num_rows + 4.0 * c.num_nodes;  // gather, dst_pos, scale; dst_ptr
    const double w_bytes = es * c.num_segments * c.dim * c.dim;
    const double out_bytes = 4.0 * c.num_nodes * c.dim;
    // floor: as fwd-scatter's (what a fused implementation must move); moved: E written and read once more
    finish_row(r, es * c.num_nodes * c.dim + w_bytes + lists + out_bytes,
               es * c.num_rows * c.dim + w_bytes + lists + 2 * es * c.num_rows * c.dim + out_bytes);
  }

  // ---- weight gradient: dW[t] = sum_rows X[src]^T (dY[dst] * scale) ----
  // accumulates: the implementation adds into dW (the SIMT template), so dW starts at zero; else it is poisoned.
  template <class Launch>
  void wgrad(const char* impl, bool accumulates, Launch launch) {
    const Case& c = g_.c;
    ensure_wgrad_reference();
    DeviceBuffer<float> dw(static_cast<int64_t>(c.num_segments) * c.dim * c.dim);
    WgradArgs<T> a{in_.x.get(), in_.dy.get(), dw.get(), g_.src.get(), g_.dst.get(), g_.scale.get(),
                   g_.seg_ptr.get(), c.num_rows, c.num_segments};
    Row r = start_row(Op::kWgrad, impl);
    auto prepare = [&] {
      if (accumulates) CUDA_CHECK(cudaMemsetAsync(dw.get(), 0, dw.size() * sizeof(float)));
      else ref::poison(dw.get(), dw.size(), nullptr);
    };
    prepare();
    launch(a);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> first = dw.download();
    errors_.reset();
    ref::compare<<<kFillBlocks, 256>>>(dw.get(), ref_dw_.get(), dw.size(), errors_.sums.get());
    CUDA_CHECK(cudaGetLastError());
    finish_check(r, Op::kWgrad);
    prepare();
    launch(a);
    CUDA_CHECK(cudaGetLastError());
    const std::vector<float> second = dw.download();
    const bool same = std::memcmp(first.data(), second.data(), first.size() * sizeof(float)) == 0;
    r.note += same ? "bit-identical x2" : "NOT DETERMINISTIC";
    if (!same) r.status = "FAIL";
    r.ms = ctx_.options.check_only ? NAN : time_median_ms(prepare, [&] { launch(a); });
    const double es = sizeof(T);
    const double lists = 12.0 * c.num_rows;
    const double dw_bytes = 4.0 * c.num_segments * c.dim * c.dim;
    finish_row(r, es * 2 * c.num_nodes * c.dim + lists + dw_bytes, es * 2 * c.num_rows * c.dim + lists + dw_bytes);
  }

  const Inputs<T>& inputs() const { return in_; }

 private:
  Row start_row(Op op, const char* impl) {
    Row r;
    r.case_name = g_.c.name;
    r.op = op_name(op);
    r.impl = impl;
    r.dtype = dtype_name(dtype_);
    return r;
  }

  void finish_check(Row& r, Op op) {
    double bad = 0;
    r.rel_err = errors_.read(bad);
    r.status = bad == 0 && r.rel_err <= tolerance(dtype_, op) ? "ok" : "FAIL";
    if (bad > 0) r.note += "non-finite outputs: " + std::to_string(static_cast<int64_t>(bad)) + "; ";
  }

  // floor_bytes: each input once (the gathered table, not its gathered rows) and each output once;
  // row_bytes: what a kernel moves that reads every gathered row from memory (the GB/s column uses it).
  void finish_row(Row& r, double floor_bytes, double row_bytes) {
    const double flops = 2.0 * g_.c.num_rows * g_.c.dim * g_.c.dim;
    r.gflops = flops / (r.ms * 1e-3) / 1e9;
    r.gbs = row_bytes / (r.ms * 1e-3) / 1e9;
    r.floor_ms = floor_bytes / (ctx_.bandwidth_gbs * 1e9) * 1e3;
    r.bandwidth_gbs = ctx_.bandwidth_gbs;
    print_row(r);
    append_csv(ctx_, r);
    ctx_.rows.push_back(r);
  }

  void ensure_scatter_reference() {
    if (ref_scatter_.size() > 0) return;
    const Case& c = g_.c;
    ref_scatter_ = DeviceBuffer<double>(c.num_nodes * c.dim);
    CUDA_CHECK(cudaMemset(ref_scatter_.get(), 0, ref_scatter_.size() * sizeof(double)));
    ref::reference_scatter<<<kFillBlocks, 256>>>(in_.x.get(), in_.w.get(), ref_scatter_.get(), g_.src.get(),
                                                 g_.dst.get(), g_.scale.get(), g_.type.get(), c.num_rows, c.dim,
                                                 c.dim);
    CUDA_CHECK(cudaGetLastError());
  }

  void ensure_wgrad_reference() {
    if (ref_dw_.size() > 0) return;
    const Case& c = g_.c;
    ref_dw_ = DeviceBuffer<double>(static_cast<int64_t>(c.num_segments) * c.dim * c.dim);
    CUDA_CHECK(cudaMemset(ref_dw_.get(), 0, ref_dw_.size() * sizeof(double)));
    const int64_t chunks = (c.num_rows + kRefChunkRows - 1) / kRefChunkRows + c.num_segments;
    ref::reference_wgrad<<<static_cast<unsigned>(chunks), 256>>>(
        in_.x.get(), in_.dy.get(), ref_dw_.get(), g_.src.get(), g_.dst.get(), g_.scale.get(), g_.seg_ptr.get(),
        g_.chunk_ref.get(), kRefChunkRows, c.num_segments, c.dim, c.dim);
    CUDA_CHECK(cudaGetLastError());
  }

  Context& ctx_;
  const Graph& g_;
  Dtype dtype_;
  Inputs<T> in_;
  ErrorSums errors_;
  DeviceBuffer<double> ref_scatter_, ref_dw_;
};

// ---- the implementations per dtype --------------------------------------------------------------------------

template <int D>
void run_simt(Context& ctx, const Graph& g, uint64_t seed) {
  if (!ctx.enabled("simt")) return;
  DtypeRun<float> run(ctx, g, Dtype::kFp32, seed);
  run.gather_store("simt", g.tile_simt.get(), [](const SegmentGemmArgs<float, float>& a) {
    simt::launch_segment_gemm<D, D, Epilogue::kStore>(a, nullptr);
  });
  run.gather_scatter_add("simt", g.tile_simt.get(), [](const SegmentGemmArgs<float, float>& a) {
    simt::launch_segment_gemm<D, D, Epilogue::kAtomic>(a, nullptr);
  });
  run.wgrad("simt", true, [](const WgradArgs<float>& a) { simt::launch_wgrad<D, D>(a, nullptr); });
  // What generated fp32 code runs (hectorgen/simt_wgrad.cuh): the split-K schedule on CUDA cores, its chunk
  // offsets computed per call on the GPU, then the ordered reduction of the partials.
  const int chunk_rows = hectorgen::wgrad_chunk_rows(g.c.num_rows, hectorgen::simt::wgrad_blocks_per_chunk<D, D, 1>());
  DeviceBuffer<float> partial(hectorgen::wgrad_max_chunks(g.c.num_rows, g.c.num_segments, chunk_rows) * D * D);
  DeviceBuffer<int32_t> chunk_ptr(g.c.num_segments + 1);
  run.wgrad("simt-splitk", false, [&](const WgradArgs<float>& a) {
    const hectorgen::simt::WgradArgs<float> s{a.x, a.dy, a.gather, a.scatter, a.scale, a.seg_ptr, a.num_rows,
                                              a.num_segments};
    CUDA_CHECK(hectorgen::launch_segment_tile_ptr(a.seg_ptr, a.num_segments, a.num_rows, chunk_rows,
                                                  chunk_ptr.get(), nullptr));
    CUDA_CHECK((hectorgen::simt::launch_wgrad_partials<float, D, D, 1>(s, chunk_ptr.get(), chunk_rows,
                                                                       partial.get(), nullptr)));
    CUDA_CHECK(hectorgen::launch_reduce_partials<float>(partial.get(), chunk_ptr.get(), a.dw, a.num_segments,
                                                        static_cast<int64_t>(D) * D, false, nullptr));
  });
}

template <class T, int D>
void run_tensor_cores(Context& ctx, const Graph& g, Dtype dtype, uint64_t seed) {
  const bool use_tc = ctx.enabled("tc"), use_cute = !std::is_same_v<T, float> && ctx.enabled("cute");
  if (!use_tc && !use_cute) return;
  DtypeRun<T> run(ctx, g, dtype, seed);
  using StoreOut = typename tc::ForwardConfig<T, D, D, Epilogue::kStore>::OutT;
  if (use_tc) run.gather_store("tc", g.tile_tc.get(), [](const SegmentGemmArgs<T, StoreOut>& a) {
    tc::launch_segment_gemm<T, D, D, Epilogue::kStore>(a, nullptr);
  });
  if constexpr (!std::is_same_v<T, float>) {
    if (use_cute) run.gather_store("cute", g.tile_cute.get(), [](const SegmentGemmArgs<T, T>& a) {
      cute_impl::launch_segment_gemm<T, D, D, Epilogue::kStore>(a, nullptr);
    });
  }
  if (use_tc) run.gather_scatter_add("tc", g.tile_tc.get(), [](const SegmentGemmArgs<T, float>& a) {
    tc::launch_segment_gemm<T, D, D, Epilogue::kAtomic>(a, nullptr);
  });
  if constexpr (!std::is_same_v<T, float>) {
    if (use_cute) run.gather_scatter_add("cute", g.tile_cute.get(), [](const SegmentGemmArgs<T, float>& a) {
      cute_impl::launch_segment_gemm<T, D, D, Epilogue::kAtomic>(a, nullptr);
    });
  }
  if (use_tc) run.gather_sorted("tc", g.tile_tc.get(), [](const SegmentGemmArgs<T, StoreOut>& a) {
    tc::launch_segment_gemm<T, D, D, Epilogue::kStore>(a, nullptr);
  });
  if constexpr (!std::is_same_v<T, float>) {
    if (use_cute) run.gather_sorted("cute", g.tile_cute.get(), [](const SegmentGemmArgs<T, T>& a) {
      cute_impl::launch_segment_gemm<T, D, D, Epilogue::kStore>(a, nullptr);
    });
  }
  if (!use_tc) return;
  DeviceBuffer<float> partial(g.max_chunks_tc * D * D);
  const int32_t* chunk_ptr = g.chunk_tc.get();
  const int chunk_rows = g.chunk_rows_tc;
  float* ws = partial.get();
  run.wgrad("tc", false, [&](const WgradArgs<T>& a) {
    tc::launch_wgrad<T, D, D>(a, chunk_ptr, chunk_rows, ws, false, nullptr);
  });
}

template <int D>
void run_case_dim(Context& ctx, const Graph& g, uint64_t seed) {
  if (ctx.enabled(Dtype::kFp32)) run_simt<D>(ctx, g, seed + 1);
  if (ctx.enabled(Dtype::kTf32)) run_tensor_cores<float, D>(ctx, g, Dtype::kTf32, seed + 2);
  if (ctx.enabled(Dtype::kBf16)) run_tensor_cores<__nv_bfloat16, D>(ctx, g, Dtype::kBf16, seed + 3);
  if (ctx.enabled(Dtype::kFp16)) run_tensor_cores<__half, D>(ctx, g, Dtype::kFp16, seed + 4);
}

void print_table(const std::vector<Row>& rows) {
  std::printf("\n== GEMM template microbenchmark: median ms (x its HBM floor); FAIL = wrong or not deterministic ==\n");
  std::printf("%-10s %-11s | %-17s %-17s %-17s %-17s %-17s %-17s %-17s\n", "case", "op", "simt fp32",
              "simt-splitk fp32", "tc tf32", "tc bf16", "cute bf16", "tc fp16", "cute fp16");
  std::vector<std::pair<std::string, std::string>> keys;
  for (const Row& r : rows) {
    const auto key = std::make_pair(r.case_name, r.op);
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
  }
  const std::pair<const char*, const char*> columns[] = {{"simt", "fp32"}, {"simt-splitk", "fp32"}, {"tc", "tf32"},
                                                         {"tc", "bf16"},   {"cute", "bf16"},        {"tc", "fp16"},
                                                         {"cute", "fp16"}};
  for (const auto& [name, op] : keys) {
    std::printf("%-10s %-11s |", name.c_str(), op.c_str());
    for (const auto& [impl, dtype] : columns) {
      const Row* found = nullptr;
      bool skipped = false;
      for (const Row& r : rows) {
        if (r.case_name == name && r.op == op && r.impl == impl && r.dtype == dtype) found = &r;
        skipped |= r.case_name == name && r.op == op && r.status == "SKIP";
      }
      char cell[64] = "";
      if (skipped) std::snprintf(cell, sizeof cell, "skipped");
      else if (found) {
        std::snprintf(cell, sizeof cell, "%s%.3f (x%.1f)", found->status == "ok" ? "" : "FAIL ", found->ms,
                      found->ms / found->floor_ms);
      }
      std::printf(" %-17s", cell);
    }
    std::printf("\n");
  }
  // Speed-up over the SIMT template, geometric mean over the cases that have both.
  std::printf("%-22s |", "geomean vs simt fp32");
  for (const auto& [impl, dtype] : columns) {
    double log_sum = 0;
    int count = 0;
    for (const Row& base : rows) {
      if (base.impl != std::string("simt") || base.status != "ok") continue;
      for (const Row& r : rows) {
        if (r.case_name == base.case_name && r.op == base.op && r.impl == impl && r.dtype == dtype &&
            r.status == "ok") {
          log_sum += std::log(base.ms / r.ms);
          ++count;
        }
      }
    }
    char cell[64] = "";
    if (count > 0) std::snprintf(cell, sizeof cell, "%.2fx (%d)", std::exp(log_sum / count), count);
    std::printf(" %-17s", cell);
  }
  std::printf("\n");
  // What determinism costs: fwd-sorted time / fwd-scatter time of the same implementation (issue 8, item 4:
  // the deterministic scatter becomes the default unless this costs more than 5%).
  std::printf("%-22s |", "fwd-sorted/fwd-scatter");
  for (const auto& [impl, dtype] : columns) {
    double log_sum = 0;
    int count = 0;
    for (const Row& sorted : rows) {
      if (sorted.op != "fwd-sorted" || sorted.impl != impl || sorted.dtype != dtype || sorted.status != "ok") continue;
      for (const Row& r : rows) {
        if (r.case_name == sorted.case_name && r.op == "fwd-scatter" && r.impl == impl && r.dtype == dtype &&
            r.status == "ok") {
          log_sum += std::log(sorted.ms / r.ms);
          ++count;
        }
      }
    }
    char cell[64] = "";
    if (count > 0) std::snprintf(cell, sizeof cell, "%.2fx (%d)", std::exp(log_sum / count), count);
    std::printf(" %-17s", cell);
  }
  std::printf("\n");
  int failures = 0, checked = 0;
  double bandwidth = NAN;
  for (const Row& r : rows) {
    failures += r.status == "FAIL";
    checked += r.status == "ok" || r.status == "FAIL";
    if (!std::isnan(r.bandwidth_gbs)) bandwidth = r.bandwidth_gbs;
  }
  std::printf("%d rows checked, %d FAIL; floor = bytes (each input and output once) / copy bandwidth %.0f GB/s\n",
              checked, failures, bandwidth);
}

// Reads rows written by append_csv (fields never contain commas).
std::vector<Row> read_csv(const std::string& path) {
  std::vector<Row> rows;
  FILE* f = std::fopen(path.c_str(), "r");
  if (!f) {
    std::fprintf(stderr, "gemm_bench: cannot read %s\n", path.c_str());
    return rows;
  }
  char line[1024];
  bool header = true;
  while (std::fgets(line, sizeof line, f)) {
    if (header) {
      header = false;
      continue;
    }
    std::vector<std::string> field;
    std::string text(line);
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
    for (size_t begin = 0, end; begin <= text.size(); begin = end + 1) {
      end = std::min(text.find(',', begin), text.size());
      field.push_back(text.substr(begin, end - begin));
    }
    if (field.size() < 13) continue;
    auto number = [](const std::string& s) { return s.empty() ? NAN : std::strtod(s.c_str(), nullptr); };
    Row r;
    r.case_name = field[0];
    r.op = field[1];
    r.impl = field[2];
    r.dtype = field[3];
    r.ms = number(field[4]);
    r.gflops = number(field[5]);
    r.gbs = number(field[6]);
    r.floor_ms = number(field[7]);
    r.rel_err = number(field[9]);
    r.status = field[10];
    r.note = field[11];
    r.bandwidth_gbs = number(field[12]);
    rows.push_back(r);
  }
  std::fclose(f);
  return rows;
}

}  // namespace
}  // namespace gemm_bench

int main(int argc, char** argv) {
  using namespace gemm_bench;
  Context ctx;
  ctx.options = parse_args(argc, argv);
  if (ctx.options.list) {
    for (const Case& c : kCases) {
      if (c.by_default) std::printf("%s\n", c.name);
    }
    return 0;
  }
  if (!ctx.options.tables.empty()) {
    std::vector<Row> rows;
    for (const std::string& path : ctx.options.tables) {
      const std::vector<Row> more = read_csv(path);
      rows.insert(rows.end(), more.begin(), more.end());
    }
    print_table(rows);
    return std::any_of(rows.begin(), rows.end(), [](const Row& r) { return r.status == "FAIL"; }) ? 1 : 0;
  }
  open_csv(ctx);
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  int driver = 0, runtime = 0;
  CUDA_CHECK(cudaDriverGetVersion(&driver));
  CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  std::printf("device: %s, sm_%d%d, %d SMs, L2 %d MB, driver %d, runtime %d\n", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount, prop.l2CacheSize >> 20, driver, runtime);
  ctx.bandwidth_gbs = ctx.options.check_only ? NAN : measure_bandwidth_gbs();
  std::printf("device-to-device copy: %.0f GB/s (read + write)\n", ctx.bandwidth_gbs);
  std::printf("seed %llu, skew %.2f, budget %.0f s\n", static_cast<unsigned long long>(ctx.options.seed),
              ctx.options.skew, ctx.options.budget_s);
  uint64_t seed = ctx.options.seed * 1000;
  for (const Case& c : kCases) {
    seed += 100;
    const bool named =
        std::find(ctx.options.cases.begin(), ctx.options.cases.end(), c.name) != ctx.options.cases.end();
    if (ctx.options.cases.empty() ? !c.by_default : !named) continue;
    if (ctx.elapsed_s() > ctx.options.budget_s) {
      std::printf("[%6.1fs] %s: SKIPPED (over the %.0f s budget)\n", ctx.elapsed_s(), c.name, ctx.options.budget_s);
      Row r;
      r.case_name = c.name;
      r.op = "all";
      r.impl = "-";
      r.dtype = "-";
      r.status = "SKIP";
      append_csv(ctx, r);
      ctx.rows.push_back(r);
      continue;
    }
    std::printf("[%6.1fs] %s: R=%d M=%lld nodes=%lld K=N=%d\n", ctx.elapsed_s(), c.name, c.num_segments,
                static_cast<long long>(c.num_rows), static_cast<long long>(c.num_nodes), c.dim);
    std::fflush(stdout);
    const Graph g = make_graph(c, ctx.options);
    std::printf("           wgrad split-K: %d rows a chunk, %d chunks\n", g.chunk_rows_tc,
                item_ptr(g.seg_ptr_host, g.chunk_rows_tc).back());
    if (c.dim == 64) run_case_dim<64>(ctx, g, seed);
    else run_case_dim<128>(ctx, g, seed);
  }
  print_table(ctx.rows);
  if (ctx.csv) std::fclose(ctx.csv);
  int failures = 0;
  for (const Row& r : ctx.rows) failures += r.status == "FAIL";
  return failures == 0 ? 0 : 1;
}
