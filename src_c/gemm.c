/* gemm.c -- SGEMM: argument checks, dispatch, and the scalar reference.
 * C[m,n] = alpha * op(A) @ op(B) + beta * C, row-major. */
#include "common.h"
#include "checks.h"
#include "gemm.h"

/* Scalar reference over rows [i0, i1) of C; overwrites (beta == 0) or scales C. */
void mdl_sgemm_scalar(int trans_a, int trans_b, int64_t i0, int64_t i1, int64_t n, int64_t k,
                      float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                      float beta, float *c, int64_t ldc)
{
    for (int64_t i = i0; i < i1; i++) {
        float *ci = c + i * ldc;
        for (int64_t j = 0; j < n; j++) ci[j] = beta == 0.0f ? 0.0f : beta * ci[j];
        for (int64_t p = 0; p < k; p++) {
            float av = alpha * (trans_a ? a[p * lda + i] : a[i * lda + p]);
            if (trans_b) {
                for (int64_t j = 0; j < n; j++) ci[j] += av * b[j * ldb + p];
            } else {
                const float *bp = b + p * ldb;
                for (int64_t j = 0; j < n; j++) ci[j] += av * bp[j];
            }
        }
    }
}

/* Enough for either SIMD kernel, so a workspace sized once fits whatever level is
 * selected later. */
size_t mdl_sgemm_workspace_size(int64_t m, int64_t n, int64_t k)
{
    if (m <= 0 || n <= 0 || k <= 0) return 0;
    if (mdl_sgemm_too_large(m, n, k)) return SIZE_MAX;
    size_t f2 = mdl_sgemm_avx2_workspace_floats(m, n, k);
    size_t f5 = mdl_sgemm_avx512_workspace_floats(m, n, k);
    return (f2 > f5 ? f2 : f5) * sizeof(float) + MDL_WS_SLACK;
}

mdl_status mdl_sgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                     const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                     float *c, int64_t ldc, void *workspace, size_t workspace_bytes)
{
    MDL_CHECK_NONNEG(m);
    MDL_CHECK_NONNEG(n);
    MDL_CHECK_NONNEG(k);
    int64_t a_cols = trans_a ? m : k, b_cols = trans_b ? k : n;
    MDL_CHECK(lda >= (a_cols > 1 ? a_cols : 1),
              "mdl_sgemm: lda must be >= %lld, got %lld", (long long)a_cols, (long long)lda);
    MDL_CHECK(ldb >= (b_cols > 1 ? b_cols : 1),
              "mdl_sgemm: ldb must be >= %lld, got %lld", (long long)b_cols, (long long)ldb);
    MDL_CHECK(ldc >= (n > 1 ? n : 1),
              "mdl_sgemm: ldc must be >= %lld, got %lld", (long long)n, (long long)ldc);
    mdl_status st = mdl_sgemm_check_span("mdl_sgemm", trans_a, trans_b, m, n, k, lda, ldb, ldc);
    if (st != MDL_OK) return st;
    if (m == 0 || n == 0) return MDL_OK;
    if (alpha == 0.0f) k = 0; /* as BLAS: A and B are not read, C = beta * C */
    MDL_CHECK_PTR(c);
    if (k > 0) {
        MDL_CHECK_PTR(a);
        MDL_CHECK_PTR(b);
    }
    /* a workspace that is too small is an error on every path, not only where it is used */
    const size_t need = k > 0 ? mdl_sgemm_workspace_size(m, n, k) : 0;
    if (workspace != NULL && workspace_bytes < need)
        return mdl_error(MDL_ERR_WORKSPACE, "mdl_sgemm: workspace has %zu bytes, needs %zu",
                         workspace_bytes, need);
    if (mdl_use_avx2() && k > 0) {
        void *owned;
        float *ws;
        mdl_status st = mdl_workspace("mdl_sgemm", workspace, workspace_bytes, need, &owned, &ws);
        if (st != MDL_OK) return st;
        if (mdl_use_avx512())
            mdl_sgemm_avx512(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, ws);
        else
            mdl_sgemm_avx2(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, ws);
        mdl_workspace_done(owned);
        return MDL_OK;
    }
    int nt = mdl_threads_for((double)m * n * (k + 1));
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int t = 0; t < nt; t++)
        mdl_sgemm_scalar(trans_a, trans_b, m * t / nt, m * (t + 1) / nt, n, k, alpha, a, lda,
                         b, ldb, beta, c, ldc);
    return MDL_OK;
}
