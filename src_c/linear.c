/* linear.c -- fully connected layer on top of mdl_sgemm (which dispatches
 * between the scalar reference and AVX2 by itself).
 *   forward           y (n, out) = x (n, in) @ w^T + b        (overwrites y)
 *   backward_data     dx (n, in) = dy (n, out) @ w            (overwrites dx)
 *   backward_weights  dw (out, in) = or += dy^T @ x; db (out) = or += column sums of dy */
#include "common.h"
#include "checks.h"

static int64_t at_least_1(int64_t v) { return v > 1 ? v : 1; }

static size_t max_size(size_t a, size_t b) { return a > b ? a : b; }

size_t mdl_linear_workspace_size(int64_t n, int64_t in, int64_t out)
{
    size_t fwd = mdl_sgemm_workspace_size(n, out, in);
    size_t bwd_data = mdl_sgemm_workspace_size(n, in, out);
    size_t bwd_weights = mdl_sgemm_workspace_size(out, in, n);
    return max_size(fwd, max_size(bwd_data, bwd_weights));
}

/* Common checks: sizes >= 0 and a given workspace at least the documented size. */
static mdl_status check_common(const char *fn, int64_t n, int64_t in, int64_t out,
                               const void *workspace, size_t workspace_bytes)
{
    MDL_CHECK(n >= 0, "%s: n must be >= 0, got %lld", fn, (long long)n);
    MDL_CHECK(in >= 0, "%s: in must be >= 0, got %lld", fn, (long long)in);
    MDL_CHECK(out >= 0, "%s: out must be >= 0, got %lld", fn, (long long)out);
    MDL_CHECK(!mdl_sgemm_too_large(n, in, out), "%s: shape too large: n = %lld, in = %lld, "
              "out = %lld (no operand may hold 2^60 elements)", fn, (long long)n, (long long)in,
              (long long)out);
    if (workspace != NULL) {
        size_t need = mdl_linear_workspace_size(n, in, out);
        if (workspace_bytes < need)
            return mdl_error(MDL_ERR_WORKSPACE, "%s: workspace has %zu bytes, needs %zu", fn,
                             workspace_bytes, need);
    }
    return MDL_OK;
}

#define CHECK_PTR_IF(cond, p, fn) \
    MDL_CHECK(!(cond) || (p) != NULL, "%s: %s must not be NULL", fn, #p)

/* y (n, out) = x (n, in) @ w^T + b; b may be NULL. */
mdl_status mdl_linear_forward(int64_t n, int64_t in, int64_t out, const float *x, const float *w,
                              const float *b, float *y, void *workspace, size_t workspace_bytes)
{
    static const char fn[] = "mdl_linear_forward";
    mdl_status st = check_common(fn, n, in, out, workspace, workspace_bytes);
    if (st != MDL_OK) return st;
    if (n == 0 || out == 0) return MDL_OK;
    CHECK_PTR_IF(in > 0, x, fn);
    CHECK_PTR_IF(in > 0, w, fn);
    CHECK_PTR_IF(1, y, fn);
    float beta = 0.0f;
    if (b != NULL) { /* y = b in every row, then y += x @ w^T */
        int nt = mdl_threads_for((double)n * out);
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int64_t i = 0; i < n; i++) {
            float *yi = y + i * out;
            for (int64_t j = 0; j < out; j++) yi[j] = b[j];
        }
        beta = 1.0f;
    }
    return mdl_sgemm(0, 1, n, out, in, 1.0f, x, at_least_1(in), w, at_least_1(in), beta, y,
                     at_least_1(out), workspace, workspace_bytes);
}

/* dx (n, in) = dy (n, out) @ w (out, in), overwritten. */
mdl_status mdl_linear_backward_data(int64_t n, int64_t in, int64_t out, const float *dy,
                                    const float *w, float *dx, void *workspace,
                                    size_t workspace_bytes)
{
    static const char fn[] = "mdl_linear_backward_data";
    mdl_status st = check_common(fn, n, in, out, workspace, workspace_bytes);
    if (st != MDL_OK) return st;
    if (n == 0 || in == 0) return MDL_OK;
    CHECK_PTR_IF(out > 0, dy, fn);
    CHECK_PTR_IF(out > 0, w, fn);
    CHECK_PTR_IF(1, dx, fn);
    return mdl_sgemm(0, 0, n, in, out, 1.0f, dy, at_least_1(out), w, at_least_1(in), 0.0f, dx,
                     at_least_1(in), workspace, workspace_bytes);
}

/* dw (out, in) = or += dy^T @ x; db (out) = or += sum over n of dy (db may be NULL). */
mdl_status mdl_linear_backward_weights(int64_t n, int64_t in, int64_t out, const float *x,
                                       const float *dy, float *dw, float *db, int accumulate,
                                       void *workspace, size_t workspace_bytes)
{
    static const char fn[] = "mdl_linear_backward_weights";
    mdl_status st = check_common(fn, n, in, out, workspace, workspace_bytes);
    if (st != MDL_OK) return st;
    MDL_CHECK(accumulate == 0 || accumulate == 1, "%s: accumulate must be 0 or 1, got %d", fn,
              accumulate);
    if (out == 0) return MDL_OK;
    CHECK_PTR_IF(n > 0 && in > 0, x, fn);
    CHECK_PTR_IF(n > 0, dy, fn);
    CHECK_PTR_IF(in > 0, dw, fn);
    if (in > 0) {
        st = mdl_sgemm(1, 0, out, in, n, 1.0f, dy, out, x, at_least_1(in),
                       accumulate ? 1.0f : 0.0f, dw, at_least_1(in), workspace, workspace_bytes);
        if (st != MDL_OK) return st;
    }
    if (db != NULL) { /* each thread sums its own range of columns over all rows */
        int nt = mdl_threads_for((double)n * out);
        if (nt > out) nt = (int)out;
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int t = 0; t < nt; t++) {
            int64_t lo = out * t / nt, hi = out * (t + 1) / nt;
            if (!accumulate)
                for (int64_t j = lo; j < hi; j++) db[j] = 0.0f;
            for (int64_t i = 0; i < n; i++) {
                const float *dyi = dy + i * out;
                for (int64_t j = lo; j < hi; j++) db[j] += dyi[j];
            }
        }
    }
    return MDL_OK;
}
