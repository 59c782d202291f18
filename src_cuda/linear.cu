/* linear.cu -- fully connected layer on the tiled SGEMM of gemm.cuh (as src_c/linear.c):
 *   forward           y (n, out) = x (n, in) @ w^T + b        (overwrites y)
 *   backward_data     dx (n, in) = dy (n, out) @ w            (overwrites dx)
 *   backward_weights  dw (out, in) = or += dy^T @ x; db (out) = or += column sums of dy */
#include "gemm.cuh"

static int64_t at_least_1(int64_t v) { return v > 1 ? v : 1; }

namespace {

/* db (out) = or += sum over the n rows of dy (n, out): one thread per column, rows in
 * order (the CPU's order: the same float sums) */
__global__ void column_sums(int64_t n, int64_t out, const float *dy, float *db, int accumulate)
{
    for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < out;
         j += (int64_t)gridDim.x * blockDim.x) {
        float acc = accumulate ? db[j] : 0.0f;
        for (int64_t i = 0; i < n; i++) acc += dy[i * out + j];
        db[j] = acc;
    }
}

} /* namespace */

size_t mdl_cuda_linear_workspace_size(int64_t n, int64_t in, int64_t out)
{
    (void)n, (void)in, (void)out;
    return 0;
}

/* Common checks: sizes >= 0 (and below the GEMM limit).  No workspace is needed, so any
 * workspace is large enough. */
static mdl_status check_common(const char *fn, int64_t n, int64_t in, int64_t out)
{
    MDL_CHECK(n >= 0, "%s: n must be >= 0, got %lld", fn, (long long)n);
    MDL_CHECK(in >= 0, "%s: in must be >= 0, got %lld", fn, (long long)in);
    MDL_CHECK(out >= 0, "%s: out must be >= 0, got %lld", fn, (long long)out);
    if (n >= MDL_GEMM_LIMIT || in >= MDL_GEMM_LIMIT || out >= MDL_GEMM_LIMIT ||
        !mdl::gemm_grid_ok(n, out) || !mdl::gemm_grid_ok(n, in) || !mdl::gemm_grid_ok(out, in))
        return mdl_cuda_error(MDL_ERR_UNSUPPORTED, "%s: n, in and out must be below 2^30, got "
                              "%lld, %lld, %lld", fn, (long long)n, (long long)in, (long long)out);
    return MDL_OK;
}

#define CHECK_PTR_IF(cond, p, fn) \
    MDL_CHECK(!(cond) || (p) != NULL, "%s: %s must not be NULL", fn, #p)

mdl_status mdl_cuda_linear_forward(int64_t n, int64_t in, int64_t out, const float *x,
                                   const float *w, const float *b, float *y, void *workspace,
                                   size_t workspace_bytes, mdl_cuda_stream stream)
{
    static const char fn[] = "mdl_cuda_linear_forward";
    (void)workspace, (void)workspace_bytes;
    mdl_status st = check_common(fn, n, in, out);
    if (st != MDL_OK) return st;
    if (n == 0 || out == 0) return MDL_OK;
    CHECK_PTR_IF(in > 0, x, fn);
    CHECK_PTR_IF(in > 0, w, fn);
    CHECK_PTR_IF(1, y, fn);
    /* y = x @ w^T + b in the GEMM's epilogue (in == 0: y = b, or 0) */
    mdl_cuda_gemm_run(0, 1, n, out, in, 1.0f, x, at_least_1(in), w, at_least_1(in), 0.0f, y,
                      at_least_1(out), b, stream);
    return mdl_cuda_launched(fn);
}

mdl_status mdl_cuda_linear_backward_data(int64_t n, int64_t in, int64_t out, const float *dy,
                                         const float *w, float *dx, void *workspace,
                                         size_t workspace_bytes, mdl_cuda_stream stream)
{
    static const char fn[] = "mdl_cuda_linear_backward_data";
    (void)workspace, (void)workspace_bytes;
    mdl_status st = check_common(fn, n, in, out);
    if (st != MDL_OK) return st;
    if (n == 0 || in == 0) return MDL_OK;
    CHECK_PTR_IF(out > 0, dy, fn);
    CHECK_PTR_IF(out > 0, w, fn);
    CHECK_PTR_IF(1, dx, fn);
    mdl_cuda_gemm_run(0, 0, n, in, out, 1.0f, dy, at_least_1(out), w, at_least_1(in), 0.0f, dx,
                      at_least_1(in), NULL, stream);
    return mdl_cuda_launched(fn);
}

mdl_status mdl_cuda_linear_backward_weights(int64_t n, int64_t in, int64_t out, const float *x,
                                            const float *dy, float *dw, float *db, int accumulate,
                                            void *workspace, size_t workspace_bytes,
                                            mdl_cuda_stream stream)
{
    static const char fn[] = "mdl_cuda_linear_backward_weights";
    (void)workspace, (void)workspace_bytes;
    mdl_status st = check_common(fn, n, in, out);
    if (st != MDL_OK) return st;
    MDL_CHECK(accumulate == 0 || accumulate == 1, "%s: accumulate must be 0 or 1, got %d", fn,
              accumulate);
    if (out == 0) return MDL_OK;
    CHECK_PTR_IF(n > 0 && in > 0, x, fn);
    CHECK_PTR_IF(n > 0, dy, fn);
    CHECK_PTR_IF(in > 0, dw, fn);
    if (in > 0)
        mdl_cuda_gemm_run(1, 0, out, in, n, 1.0f, dy, out, x, at_least_1(in),
                          accumulate ? 1.0f : 0.0f, dw, at_least_1(in), NULL, stream);
    if (db != NULL)
        column_sums<<<mdl_ew_blocks(out), MDL_EW_THREADS, 0, stream>>>(n, out, dy, db, accumulate);
    return mdl_cuda_launched(fn);
}
