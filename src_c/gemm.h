/* gemm.h -- internal: SGEMM kernels shared by gemm.c, gemm_avx2.c, gemm_avx512.c and the ops
 * built on GEMM. */
#ifndef MDL_GEMM_H
#define MDL_GEMM_H
#include <stdint.h>
#include <stddef.h>
#include "common.h"

void mdl_sgemm_scalar(int trans_a, int trans_b, int64_t i0, int64_t i1, int64_t n, int64_t k,
                      float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                      float beta, float *c, int64_t ldc);

#if MDL_X86
/* Packing buffers of the blocked AVX2 kernel, in floats (independent of the thread count). */
size_t mdl_sgemm_avx2_workspace_floats(int64_t m, int64_t n, int64_t k);
/* Blocked AVX2+FMA SGEMM, threaded inside; ws is 64-byte aligned and holds
 * mdl_sgemm_avx2_workspace_floats(m, n, k) floats.  Needs m, n, k >= 1. */
void mdl_sgemm_avx2(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                    float *c, int64_t ldc, float *ws);
/* The same contract for the blocked AVX-512F SGEMM (gemm_avx512.c). */
size_t mdl_sgemm_avx512_workspace_floats(int64_t m, int64_t n, int64_t k);
void mdl_sgemm_avx512(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                      const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                      float *c, int64_t ldc, float *ws);
#else /* mdl_use_avx2() is never true off x86; these names only keep the dispatch compiling */
#  define mdl_sgemm_avx2_workspace_floats(m, n, k) ((void)(m), (void)(n), (void)(k), (size_t)0)
#  define mdl_sgemm_avx2(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, ws) \
    ((void)(ws), mdl_sgemm_scalar(ta, tb, 0, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc))
#  define mdl_sgemm_avx512_workspace_floats(m, n, k) ((void)(m), (void)(n), (void)(k), (size_t)0)
#  define mdl_sgemm_avx512(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, ws) \
    ((void)(ws), mdl_sgemm_scalar(ta, tb, 0, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc))
#endif
#endif
