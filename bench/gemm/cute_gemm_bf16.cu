// (c) The CuTe forward segment GEMM for __nv_bfloat16 (see cute_gemm_kernel.cuh).
#include "cute_gemm_kernel.cuh"

GEMM_BENCH_CUTE_INSTANTIATE(__nv_bfloat16, 64)
GEMM_BENCH_CUTE_INSTANTIATE(__nv_bfloat16, 128)
