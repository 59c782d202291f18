/* act.c -- elementwise ops: ReLU, add, the per-channel affine add, dropout.  Scalar
 * references here; AVX2 versions in act_avx2.c.  All overwrite their output. */
#include "common.h"
#include "act.h"
#include "checks.h"

/* ---- scalar references ---------------------------------------------------- */

/* y[count] = max(x, 0); NaN stays NaN */
void mdl_relu_forward_scalar(int64_t lo, int64_t hi, const float *x, float *y)
{
    for (int64_t i = lo; i < hi; i++) y[i] = x[i] < 0.0f ? 0.0f : x[i];
}

/* dx[count] = x > 0 ? dy : 0 */
void mdl_relu_backward_scalar(int64_t lo, int64_t hi, const float *x, const float *dy, float *dx)
{
    for (int64_t i = lo; i < hi; i++) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
}

/* y[count] = a + b */
void mdl_add_scalar(int64_t lo, int64_t hi, const float *a, const float *b, float *y)
{
    for (int64_t i = lo; i < hi; i++) y[i] = a[i] + b[i];
}

/* y[count] = keep(seed, i) ? x * scale : 0 */
void mdl_dropout_scalar(int64_t lo, int64_t hi, uint32_t threshold, float scale, uint64_t seed,
                        const float *x, float *y)
{
    for (int64_t i = lo; i < hi; i++)
        y[i] = (mdl_dropout_hash(seed, i) >> 8) >= threshold ? x[i] * scale : 0.0f;
}

void mdl_affine_row_scalar(const float *src, int64_t n, mdl_affine_ch g, float *d)
{
    for (int64_t j = 0; j < n; j++) d[j] = mdl_affine_apply(src[j], g);
}

void mdl_affine_add_scalar(int64_t r0, int64_t r1, int64_t j0, int64_t c, int64_t hw,
                           const float *a, const mdl_affine *fa, const float *b,
                           const mdl_affine *fb, int relu, float *y)
{
    for (int64_t r = r0; r < r1; r++) {
        const mdl_affine_ch ga = mdl_affine_at(fa, r % c), gb = mdl_affine_at(fb, r % c);
        for (int64_t j = r * hw + j0; j < (r + 1) * hw; j++) {
            float v = mdl_affine_apply(a[j], ga) + (b ? mdl_affine_apply(b[j], gb) : 0.0f);
            y[j] = relu && v < 0.0f ? 0.0f : v;
        }
    }
}

/* ---- dispatch ------------------------------------------------------------- */

mdl_status mdl_relu_forward(int64_t count, const float *x, float *y)
{
    MDL_CHECK_NONNEG(count);
    if (count == 0) return MDL_OK;
    MDL_CHECK_PTR(x);
    MDL_CHECK_PTR(y);
    int avx2 = mdl_use_avx2();
    MDL_PARALLEL_RANGES(count, (double)count,
                        if (avx2) mdl_relu_forward_avx2(lo, hi, x, y);
                        else mdl_relu_forward_scalar(lo, hi, x, y));
    return MDL_OK;
}

mdl_status mdl_relu_backward(int64_t count, const float *x, const float *dy, float *dx)
{
    MDL_CHECK_NONNEG(count);
    if (count == 0) return MDL_OK;
    MDL_CHECK_PTR(x);
    MDL_CHECK_PTR(dy);
    MDL_CHECK_PTR(dx);
    int avx2 = mdl_use_avx2();
    MDL_PARALLEL_RANGES(count, (double)count,
                        if (avx2) mdl_relu_backward_avx2(lo, hi, x, dy, dx);
                        else mdl_relu_backward_scalar(lo, hi, x, dy, dx));
    return MDL_OK;
}

mdl_status mdl_add(int64_t count, const float *a, const float *b, float *y)
{
    MDL_CHECK_NONNEG(count);
    if (count == 0) return MDL_OK;
    MDL_CHECK_PTR(a);
    MDL_CHECK_PTR(b);
    MDL_CHECK_PTR(y);
    int avx2 = mdl_use_avx2();
    MDL_PARALLEL_RANGES(count, (double)count,
                        if (avx2) mdl_add_avx2(lo, hi, a, b, y);
                        else mdl_add_scalar(lo, hi, a, b, y));
    return MDL_OK;
}

mdl_status mdl_affine_add(int64_t n, int64_t c, int64_t hw, const float *a,
                          const mdl_affine *fa, const float *b, const mdl_affine *fb, int relu,
                          float *y)
{
    MDL_CHECK(n >= 0 && c >= 1 && hw >= 0, "%s: need n >= 0, c >= 1, hw >= 0, got n = %lld, "
              "c = %lld, hw = %lld", __func__, (long long)n, (long long)c, (long long)hw);
    MDL_CHECK_AFFINE(__func__, fa, "fa");
    MDL_CHECK_AFFINE(__func__, fb, "fb");
    if (n == 0 || hw == 0) return MDL_OK;
    MDL_CHECK(n <= INT64_MAX / c / hw, "%s: n * c * hw overflows int64 (n = %lld, c = %lld, "
              "hw = %lld)", __func__, (long long)n, (long long)c, (long long)hw);
    MDL_CHECK_PTR(a);
    MDL_CHECK_PTR(y);
    const int64_t rows = n * c;
    int avx2 = mdl_use_avx2();
    MDL_PARALLEL_RANGES(rows, (double)rows * hw,
                        if (avx2) mdl_affine_add_avx2(lo, hi, c, hw, a, fa, b, fb, relu, y);
                        else mdl_affine_add_scalar(lo, hi, 0, c, hw, a, fa, b, fb, relu, y));
    return MDL_OK;
}

static mdl_status dropout(const char *fn, int64_t count, float p, uint64_t seed,
                          const float *x, float *y)
{
    MDL_CHECK(count >= 0, "%s: count must be >= 0, got %lld", fn, (long long)count);
    MDL_CHECK(p >= 0.0f && p < 1.0f, "%s: p must be in [0, 1), got %g", fn, (double)p);
    if (count == 0) return MDL_OK;
    MDL_CHECK(x != NULL && y != NULL, "%s: input and output must not be NULL", fn);
    /* keep iff 24-bit hash >= ceil(p * 2^24): P(keep) = 1 - p up to 2^-24 */
    uint32_t threshold = (uint32_t)((double)p * 16777216.0);
    if ((double)threshold < (double)p * 16777216.0) threshold++;
    float scale = 1.0f / (1.0f - p);
    int avx2 = mdl_use_avx2();
    MDL_PARALLEL_RANGES(count, (double)count,
                        if (avx2) mdl_dropout_avx2(lo, hi, threshold, scale, seed, x, y);
                        else mdl_dropout_scalar(lo, hi, threshold, scale, seed, x, y));
    return MDL_OK;
}

mdl_status mdl_dropout_forward(int64_t count, float p, uint64_t seed, const float *x, float *y)
{
    return dropout("mdl_dropout_forward", count, p, seed, x, y);
}

/* The mask and scale are the forward's, so the backward is the same map applied to dy. */
mdl_status mdl_dropout_backward(int64_t count, float p, uint64_t seed, const float *dy, float *dx)
{
    return dropout("mdl_dropout_backward", count, p, seed, dy, dx);
}
