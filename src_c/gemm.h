/* gemm.h -- internal: SGEMM kernels shared by gemm.c, gemm_avx2.c and the ops built on GEMM. */
#ifndef MDL_GEMM_H
#define MDL_GEMM_H
#include <stdint.h>
#include <stddef.h>

void mdl_sgemm_scalar(int trans_a, int trans_b, int64_t i0, int64_t i1, int64_t n, int64_t k,
                      float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                      float beta, float *c, int64_t ldc);

/* Packing buffers of the blocked AVX2 kernel, in floats (independent of the thread count). */
size_t mdl_sgemm_avx2_workspace_floats(int64_t m, int64_t n, int64_t k);
/* Blocked AVX2+FMA SGEMM, threaded inside; ws is 64-byte aligned and holds
 * mdl_sgemm_avx2_workspace_floats(m, n, k) floats. */
void mdl_sgemm_avx2(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                    float *c, int64_t ldc, float *ws);
#endif
