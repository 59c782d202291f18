/* gemm.cu -- SGEMM, C[m,n] = alpha * op(A) @ op(B) + beta * C, row-major, on the
 * tiled kernel of gemm.cuh; argument checks as in src_c/gemm.c. */
#include "gemm.cuh"
#include "../src_c/checks.h"

size_t mdl_cuda_sgemm_workspace_size(int64_t m, int64_t n, int64_t k)
{
    (void)m, (void)n, (void)k;
    return 0;
}

void mdl_cuda_gemm_run(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                       const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                       float *c, int64_t ldc, const float *col_bias, cudaStream_t stream)
{
#define MDL_PLAIN(TA, TB)                                                                  \
    do {                                                                                   \
        mdl::PlainGemm<TA, TB> p = {(int)m, (int)n, (int)k, (int)k, a, b, c, lda, ldb, ldc, \
                                    alpha, beta, col_bias};                                \
        mdl::gemm_launch(p, 1, stream);                                                    \
    } while (0)
    if (!trans_a && !trans_b) MDL_PLAIN(false, false);
    else if (!trans_a && trans_b) MDL_PLAIN(false, true);
    else if (trans_a && !trans_b) MDL_PLAIN(true, false);
    else MDL_PLAIN(true, true);
#undef MDL_PLAIN
}

mdl_status mdl_cuda_sgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                          const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                          float *c, int64_t ldc, void *workspace, size_t workspace_bytes,
                          mdl_cuda_stream stream)
{
    (void)workspace, (void)workspace_bytes; /* none needed: any workspace is large enough */
    MDL_CHECK_NONNEG(m);
    MDL_CHECK_NONNEG(n);
    MDL_CHECK_NONNEG(k);
    int64_t a_cols = trans_a ? m : k, b_cols = trans_b ? k : n;
    MDL_CHECK(lda >= (a_cols > 1 ? a_cols : 1),
              "mdl_cuda_sgemm: lda must be >= %lld, got %lld", (long long)a_cols, (long long)lda);
    MDL_CHECK(ldb >= (b_cols > 1 ? b_cols : 1),
              "mdl_cuda_sgemm: ldb must be >= %lld, got %lld", (long long)b_cols, (long long)ldb);
    MDL_CHECK(ldc >= (n > 1 ? n : 1),
              "mdl_cuda_sgemm: ldc must be >= %lld, got %lld", (long long)n, (long long)ldc);
    mdl_status st = mdl_sgemm_check_span("mdl_cuda_sgemm", trans_a, trans_b, m, n, k, lda, ldb,
                                         ldc);
    if (st != MDL_OK) return st;
    if (m == 0 || n == 0) return MDL_OK;
    if (alpha == 0.0f) k = 0; /* as BLAS: A and B are not read, C = beta * C */
    MDL_CHECK_PTR(c);
    if (k > 0) {
        MDL_CHECK_PTR(a);
        MDL_CHECK_PTR(b);
    }
    if (m >= MDL_GEMM_LIMIT || n >= MDL_GEMM_LIMIT || k >= MDL_GEMM_LIMIT || !mdl::gemm_grid_ok(m, n))
        return mdl_cuda_error(MDL_ERR_UNSUPPORTED,
                              "mdl_cuda_sgemm: m, n and k must be below 2^30 and the "
                              "product's grid within CUDA's limits, got %lld, %lld, %lld",
                              (long long)m, (long long)n, (long long)k);
    mdl_cuda_gemm_run(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, NULL, stream);
    return mdl_cuda_launched(__func__);
}
