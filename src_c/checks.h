/* checks.h -- host-side argument checks and shape arithmetic shared by the C
 * core (src_c/X.c) and the CUDA kernels (src_cuda/X.cu), so that both check
 * the same way and say the same thing.  Not installed.
 *
 * Written in the C subset that also compiles as C++ under nvcc.  The includer
 * must define MDL_CHECK(cond, ...) first (src_c/common.h or
 * src_cuda/common.cuh): it returns MDL_ERR_ARG with the message through that
 * side's error function.  Each check names the public function `fn`. */
#ifndef MDL_CHECKS_H
#define MDL_CHECKS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include "minidl.h"

#ifndef MDL_CHECK
#  error "checks.h: include common.h (C) or common.cuh (CUDA) first, for MDL_CHECK"
#endif

/* MDL_CHECK_PTR / MDL_CHECK_NONNEG / MDL_CHECK_POS with the function named by `fn`
 * rather than __func__ (which here would name the helper). */
#define MDL_CHECK_PTR_FN(fn, p) MDL_CHECK((p) != NULL, "%s: %s must not be NULL", fn, #p)
#define MDL_CHECK_NONNEG_FN(fn, v) \
    MDL_CHECK((v) >= 0, "%s: %s must be >= 0, got %lld", fn, #v, (long long)(v))
#define MDL_CHECK_POS_FN(fn, v) \
    MDL_CHECK((v) >= 1, "%s: %s must be >= 1, got %lld", fn, #v, (long long)(v))

/* the map `a` (an mdl_affine, or NULL) has scale and shift both given or both NULL;
 * `name` names it in the message */
#define MDL_CHECK_AFFINE(fn, a, name)                                                     \
    MDL_CHECK((a) == NULL || ((a)->scale == NULL) == ((a)->shift == NULL),                \
              "%s: %s->scale and %s->shift must both be given or both be NULL", fn, name, \
              name)

/* ---- convolution ------------------------------------------------------------------- */

#define MDL_CONV_SIZE_LIMIT 2147483647LL           /* every shape field fits in 31 bits */
#define MDL_CONV_COUNT_LIMIT 1152921504606846976.0 /* 2^60 elements in any tensor or buffer */

/* The shape fields in range, the kernel within the padded input, every tensor
 * (and the column matrix) below 2^60 elements; the output size in *ho, *wo. */
static inline mdl_status mdl_conv2d_check_shape(const char *fn, const mdl_conv2d_shape *s,
                                                int64_t *ho, int64_t *wo)
{
    MDL_CHECK(s != NULL, "%s: shape s must not be NULL", fn);
#define MDL_FIELD_IN_(f, lo)                                                                \
    MDL_CHECK(s->f >= (lo) && s->f <= MDL_CONV_SIZE_LIMIT,                                  \
              "%s: shape field %s must be in [%d, %lld], got %lld", fn, #f, (lo),           \
              MDL_CONV_SIZE_LIMIT, (long long)s->f)
    MDL_FIELD_IN_(n, 1);
    MDL_FIELD_IN_(c_in, 1);
    MDL_FIELD_IN_(h, 1);
    MDL_FIELD_IN_(w, 1);
    MDL_FIELD_IN_(c_out, 1);
    MDL_FIELD_IN_(kh, 1);
    MDL_FIELD_IN_(kw, 1);
    MDL_FIELD_IN_(stride_h, 1);
    MDL_FIELD_IN_(stride_w, 1);
    MDL_FIELD_IN_(pad_h, 0);
    MDL_FIELD_IN_(pad_w, 0);
#undef MDL_FIELD_IN_
    int64_t hp = s->h + 2 * s->pad_h, wp = s->w + 2 * s->pad_w;
    MDL_CHECK(hp >= s->kh && wp >= s->kw,
              "%s: kernel size can't be greater than actual input size: kernel (kh, kw) = "
              "(%lld, %lld), padded input (h + 2*pad_h, w + 2*pad_w) = (%lld, %lld)",
              fn, (long long)s->kh, (long long)s->kw, (long long)hp, (long long)wp);
    int64_t oh = (hp - s->kh) / s->stride_h + 1, ow = (wp - s->kw) / s->stride_w + 1;
    double x_count = (double)s->n * s->c_in * s->h * s->w;
    double y_count = (double)s->n * s->c_out * oh * ow;
    double col_count = (double)s->c_in * s->kh * s->kw * oh * ow;
    double w_count = (double)s->c_out * s->c_in * s->kh * s->kw;
    MDL_CHECK(x_count <= MDL_CONV_COUNT_LIMIT && y_count <= MDL_CONV_COUNT_LIMIT &&
                  col_count <= MDL_CONV_COUNT_LIMIT && w_count <= MDL_CONV_COUNT_LIMIT,
              "%s: shape too large: x has %.0f elements, y %.0f, w %.0f, the column matrix %.0f "
              "(limit 2^60)", fn, x_count, y_count, w_count, col_count);
    *ho = oh;
    *wo = ow;
    return MDL_OK;
}

/* ---- pooling ----------------------------------------------------------------------- */

static inline int64_t mdl_pool_floor_div(int64_t a, int64_t b) /* b > 0 */
{
    return a >= 0 ? a / b : -((-a + b - 1) / b);
}

/* PyTorch's pooling_output_shape: in ceil mode the last window must start
 * inside the input or its left padding. */
static inline int64_t mdl_pool_out_size(int64_t size, int64_t k, int64_t stride, int64_t pad,
                                        int ceil_mode)
{
    int64_t out = mdl_pool_floor_div(size + 2 * pad - k + (ceil_mode ? stride - 1 : 0), stride) + 1;
    if (ceil_mode && (out - 1) * stride >= size + pad) out--;
    return out;
}

/* Every size field in [lo, 2^31), each padding at most half its kernel, an
 * output of at least 1 x 1; the output size in *ho, *wo. */
static inline mdl_status mdl_pool2d_check_shape(const char *fn, const mdl_pool2d_shape *s,
                                                int64_t *ho, int64_t *wo)
{
    MDL_CHECK(s != NULL, "%s: s must not be NULL", fn);
#define MDL_CHECK_DIM_(f, lo)                                                                 \
    MDL_CHECK(s->f >= (lo) && s->f < ((int64_t)1 << 31),                                      \
              "%s: " #f " must be in [%d, 2^31), got %lld", fn, (int)(lo), (long long)s->f)
#define MDL_CHECK_PAD_(p, k)                                                                 \
    MDL_CHECK(s->p >= 0 && s->p <= s->k / 2,                                                 \
              "%s: " #p " must be in [0, " #k " / 2] = [0, %lld] (padding should be at most " \
              "half the kernel size), got %lld", fn, (long long)(s->k / 2), (long long)s->p)
    MDL_CHECK_DIM_(n, 1);
    MDL_CHECK_DIM_(c, 1);
    MDL_CHECK_DIM_(h, 1);
    MDL_CHECK_DIM_(w, 1);
    MDL_CHECK_DIM_(kh, 1);
    MDL_CHECK_DIM_(kw, 1);
    MDL_CHECK_DIM_(stride_h, 1);
    MDL_CHECK_DIM_(stride_w, 1);
    MDL_CHECK_PAD_(pad_h, kh);
    MDL_CHECK_PAD_(pad_w, kw);
#undef MDL_CHECK_DIM_
#undef MDL_CHECK_PAD_
    int64_t oh = mdl_pool_out_size(s->h, s->kh, s->stride_h, s->pad_h, s->ceil_mode);
    int64_t ow = mdl_pool_out_size(s->w, s->kw, s->stride_w, s->pad_w, s->ceil_mode);
    MDL_CHECK(oh >= 1, "%s: output too small: h_out = %lld for h = %lld, kh = %lld, stride_h = %lld, "
              "pad_h = %lld", fn, (long long)oh, (long long)s->h, (long long)s->kh,
              (long long)s->stride_h, (long long)s->pad_h);
    MDL_CHECK(ow >= 1, "%s: output too small: w_out = %lld for w = %lld, kw = %lld, stride_w = %lld, "
              "pad_w = %lld", fn, (long long)ow, (long long)s->w, (long long)s->kw,
              (long long)s->stride_w, (long long)s->pad_w);
    double x_count = (double)s->n * s->c * s->h * s->w, y_count = (double)s->n * s->c * oh * ow;
    MDL_CHECK(x_count <= MDL_CONV_COUNT_LIMIT && y_count <= MDL_CONV_COUNT_LIMIT,
              "%s: shape too large: x has %.0f elements, y %.0f (limit 2^60)", fn, x_count,
              y_count);
    *ho = oh;
    *wo = ow;
    return MDL_OK;
}

/* ---- SGEMM ------------------------------------------------------------------------- */

/* A product whose operands hold 2^60 elements or more (the limit of the convolutions'
 * tensors): more than any memory, and its sizes and offsets would overflow int64 */
static inline int mdl_sgemm_too_large(int64_t m, int64_t n, int64_t k)
{
    return (double)m * k > MDL_CONV_COUNT_LIMIT || (double)k * n > MDL_CONV_COUNT_LIMIT ||
           (double)m * n > MDL_CONV_COUNT_LIMIT;
}

/* That, and no operand spanning 2^60 elements with its leading dimension. */
static inline mdl_status mdl_sgemm_check_span(const char *fn, int trans_a, int trans_b,
                                              int64_t m, int64_t n, int64_t k, int64_t lda,
                                              int64_t ldb, int64_t ldc)
{
    const int64_t a_rows = trans_a ? k : m, b_rows = trans_b ? n : k;
    MDL_CHECK(!mdl_sgemm_too_large(m, n, k) && (double)a_rows * lda <= MDL_CONV_COUNT_LIMIT &&
                  (double)b_rows * ldb <= MDL_CONV_COUNT_LIMIT &&
                  (double)m * ldc <= MDL_CONV_COUNT_LIMIT,
              "%s: shape too large: m = %lld, n = %lld, k = %lld, lda = %lld, ldb = %lld, "
              "ldc = %lld (no operand may span 2^60 elements)", fn, (long long)m, (long long)n,
              (long long)k, (long long)lda, (long long)ldb, (long long)ldc);
    return MDL_OK;
}

/* ---- optimizers -------------------------------------------------------------------- */

/* The arguments of an SGD step (the pointers only when count > 0). */
static inline mdl_status mdl_sgd_check_args(const char *fn, int64_t count, const float *param,
                                            const float *grad, const float *momentum_buf,
                                            float lr, float momentum, float dampening,
                                            float weight_decay, int nesterov)
{
    MDL_CHECK_NONNEG_FN(fn, count);
    MDL_CHECK(lr >= 0.0f, "%s: lr must be >= 0, got %g", fn, (double)lr);
    MDL_CHECK(momentum >= 0.0f, "%s: momentum must be >= 0, got %g", fn, (double)momentum);
    MDL_CHECK(weight_decay >= 0.0f, "%s: weight_decay must be >= 0, got %g", fn,
              (double)weight_decay);
    MDL_CHECK(!nesterov || (momentum > 0.0f && dampening == 0.0f),
              "%s: nesterov needs momentum > 0 and dampening == 0, got momentum %g, dampening %g",
              fn, (double)momentum, (double)dampening);
    if (count == 0) return MDL_OK;
    MDL_CHECK_PTR_FN(fn, param);
    MDL_CHECK_PTR_FN(fn, grad);
    MDL_CHECK(momentum == 0.0f || momentum_buf != NULL,
              "%s: momentum_buf must not be NULL when momentum != 0 (momentum %g)", fn,
              (double)momentum);
    return MDL_OK;
}

/* The arguments of an Adam step (the pointers only when count > 0). */
static inline mdl_status mdl_adam_check_args(const char *fn, int64_t count, const float *param,
                                             const float *grad, const float *exp_avg,
                                             const float *exp_avg_sq, int64_t step, float lr,
                                             float beta1, float beta2, float eps,
                                             float weight_decay)
{
    MDL_CHECK_NONNEG_FN(fn, count);
    MDL_CHECK_POS_FN(fn, step);
    MDL_CHECK(lr >= 0.0f, "%s: lr must be >= 0, got %g", fn, (double)lr);
    MDL_CHECK(beta1 >= 0.0f && beta1 < 1.0f, "%s: beta1 must be in [0, 1), got %g", fn,
              (double)beta1);
    MDL_CHECK(beta2 >= 0.0f && beta2 < 1.0f, "%s: beta2 must be in [0, 1), got %g", fn,
              (double)beta2);
    MDL_CHECK(eps >= 0.0f, "%s: eps must be >= 0, got %g", fn, (double)eps);
    MDL_CHECK(weight_decay >= 0.0f, "%s: weight_decay must be >= 0, got %g", fn,
              (double)weight_decay);
    if (count == 0) return MDL_OK;
    MDL_CHECK_PTR_FN(fn, param);
    MDL_CHECK_PTR_FN(fn, grad);
    MDL_CHECK_PTR_FN(fn, exp_avg);
    MDL_CHECK_PTR_FN(fn, exp_avg_sq);
    return MDL_OK;
}

/* ---- batch normalization ----------------------------------------------------------- */

/* n, c, hw >= 1 and n * c * hw within int64. */
static inline mdl_status mdl_bn_check_shape(const char *fn, int64_t n, int64_t c, int64_t hw)
{
    MDL_CHECK(n >= 1, "%s: n must be >= 1, got %lld", fn, (long long)n);
    MDL_CHECK(c >= 1, "%s: c must be >= 1, got %lld", fn, (long long)c);
    MDL_CHECK(hw >= 1, "%s: hw must be >= 1, got %lld", fn, (long long)hw);
    MDL_CHECK(n <= INT64_MAX / c / hw,
              "%s: n * c * hw overflows int64 (n = %lld, c = %lld, hw = %lld)", fn, (long long)n,
              (long long)c, (long long)hw);
    return MDL_OK;
}

static inline mdl_status mdl_bn_check_eps(const char *fn, float eps)
{
    MDL_CHECK(eps >= 0.0f && isfinite(eps), "%s: eps must be finite and >= 0, got %g", fn,
              (double)eps);
    return MDL_OK;
}

/* The arguments of forward_train after the shape. */
static inline mdl_status mdl_bn_check_train_args(const char *fn, int64_t n, int64_t hw,
                                                 const float *x, const float *gamma,
                                                 const float *beta, float eps, float momentum,
                                                 const float *running_mean,
                                                 const float *running_var, const float *y,
                                                 const float *save_mean,
                                                 const float *save_invstd)
{
    mdl_status st = mdl_bn_check_eps(fn, eps);
    if (st != MDL_OK) return st;
    MDL_CHECK(momentum >= 0.0f && momentum <= 1.0f, "%s: momentum must be in [0, 1], got %g",
              fn, (double)momentum);
    MDL_CHECK_PTR_FN(fn, x);
    MDL_CHECK_PTR_FN(fn, gamma);
    MDL_CHECK_PTR_FN(fn, beta);
    MDL_CHECK_PTR_FN(fn, y);
    MDL_CHECK_PTR_FN(fn, save_mean);
    MDL_CHECK_PTR_FN(fn, save_invstd);
    MDL_CHECK((running_mean == NULL) == (running_var == NULL),
              "%s: running_mean and running_var must be both given or both NULL, got %s NULL",
              fn, running_mean == NULL ? "only running_mean" : "only running_var");
    MDL_CHECK(n * hw > 1,
              "%s: expected more than 1 value per channel when training, got n * hw = %lld",
              fn, (long long)(n * hw));
    return MDL_OK;
}

/* The arguments of forward_infer after the shape. */
static inline mdl_status mdl_bn_check_infer_args(const char *fn, const float *x,
                                                 const float *gamma, const float *beta,
                                                 const float *running_mean,
                                                 const float *running_var, float eps,
                                                 const float *y)
{
    mdl_status st = mdl_bn_check_eps(fn, eps);
    if (st != MDL_OK) return st;
    MDL_CHECK_PTR_FN(fn, x);
    MDL_CHECK_PTR_FN(fn, gamma);
    MDL_CHECK_PTR_FN(fn, beta);
    MDL_CHECK_PTR_FN(fn, running_mean);
    MDL_CHECK_PTR_FN(fn, running_var);
    MDL_CHECK_PTR_FN(fn, y);
    return MDL_OK;
}

/* The arguments of backward after the shape. */
static inline mdl_status mdl_bn_check_backward_args(const char *fn, const float *x,
                                                    const float *gamma, const float *dy,
                                                    const float *save_mean,
                                                    const float *save_invstd, const float *dx,
                                                    const float *dgamma, const float *dbeta)
{
    MDL_CHECK_PTR_FN(fn, x);
    MDL_CHECK_PTR_FN(fn, gamma);
    MDL_CHECK_PTR_FN(fn, dy);
    MDL_CHECK_PTR_FN(fn, save_mean);
    MDL_CHECK_PTR_FN(fn, save_invstd);
    MDL_CHECK_PTR_FN(fn, dx);
    MDL_CHECK_PTR_FN(fn, dgamma);
    MDL_CHECK_PTR_FN(fn, dbeta);
    return MDL_OK;
}

#endif /* MDL_CHECKS_H */
