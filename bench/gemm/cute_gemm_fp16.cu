// (c) The CuTe forward segment GEMM for __half (see cute_gemm_kernel.cuh).
#include "cute_gemm_kernel.cuh"

GEMM_BENCH_CUTE_INSTANTIATE(__half, 64)
GEMM_BENCH_CUTE_INSTANTIATE(__half, 128)
