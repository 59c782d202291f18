/* gemm_avx2.c -- blocked AVX2+FMA SGEMM (placeholder: calls the scalar reference). */
#include "common.h"
#include "gemm.h"

size_t mdl_sgemm_avx2_workspace_floats(int64_t m, int64_t n, int64_t k) { return 0; }

void mdl_sgemm_avx2(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                    float *c, int64_t ldc, float *ws)
{
    mdl_sgemm_scalar(trans_a, trans_b, 0, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
