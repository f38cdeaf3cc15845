// Shared pieces of the GEMM microbenchmark: error checks, the storage/arithmetic classes, and the names it takes
// from the tensor-core kernels' header hectorgen/tc_gemm.cuh (the problem description: segment GEMM over
// type-sorted rows with gather/scatter lists; conversions; PTX wrappers).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "hectorgen/tc_gemm.cuh"

#define CUDA_CHECK(call)                                                                          \
  do {                                                                                            \
    const cudaError_t err_ = (call);                                                              \
    if (err_ != cudaSuccess) {                                                                    \
      std::fprintf(stderr, "%s:%d: CUDA error %s: %s\n", __FILE__, __LINE__, #call,               \
                   cudaGetErrorString(err_));                                                     \
      std::exit(2);                                                                               \
    }                                                                                             \
  } while (0)

namespace gemm_bench {

// Storage/arithmetic class of an instance: tf32 stores fp32 and multiplies in tf32; the 16-bit ones store
// and multiply in 16 bits; all accumulate in fp32.
enum class Dtype { kFp32, kTf32, kBf16, kFp16 };

inline const char* dtype_name(Dtype d) {
  switch (d) {
    case Dtype::kFp32: return "fp32";
    case Dtype::kTf32: return "tf32";
    case Dtype::kBf16: return "bf16";
    case Dtype::kFp16: return "fp16";
  }
  return "?";
}

// The kernels' arguments and device helpers come from the runtime's tensor-core header (runtime/include, the home
// of the kernels the generator uses); the variants here (SIMT, CuTe, reference) share them.
namespace tc = hectorgen::tc;
using tc::Epilogue;
using tc::SegmentGemmArgs;
using tc::WgradArgs;
using tc::atomic_add_float4;
using tc::cp_async_16;
using tc::cp_async_commit;
using tc::cp_async_wait;
using tc::find_segment;
using tc::from_float;
using tc::to_float;

}  // namespace gemm_bench
