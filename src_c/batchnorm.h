/* batchnorm.h -- internal: kernels of batchnorm.c / batchnorm_avx2.c.
 *
 * Every kernel handles the channels [c0, c1) of a tensor (n, c, hw) and
 * touches no other channel, so threads split the channel range freely.
 * The per-channel arithmetic that turns sums into statistics and
 * coefficients lives here, shared, so that both versions agree on it and
 * differ only in how they sum and sweep.
 *
 * Sums are taken relative to a shift K (the scalar version uses its double
 * mean, from a first pass; the AVX2 version the mean of the channel's first
 * row, rounded to float, so that one pass gives both sums): with d = x - K,
 *     mean = K + sum(d) / m,   var = sum(d^2) / m - (sum(d) / m)^2,
 * which stays accurate when |mean| >> std because d is small. */
#ifndef MDL_BATCHNORM_H
#define MDL_BATCHNORM_H
#include <math.h>
#include <stdint.h>
#include "common.h"

/* Per-channel training statistics from the shifted sums sd = sum(x - k) and
 * sd2 = sum((x - k)^2) over m values.  Writes save_mean/save_invstd and, when
 * rm is not NULL, the running statistics (unbiased variance, m > 1).  Returns
 * the coefficients of y = (x - *mf) * *scale + *shift, where *mf is the saved
 * float mean and *shift absorbs its rounding error. */
static inline void mdl_bn_finish_train(int64_t m, double k, double sd, double sd2, float gamma,
                                       float beta, float eps, float momentum, float *rm,
                                       float *rv, float *save_mean, float *save_invstd,
                                       float *mf, float *scale, float *shift)
{
    double dm = sd / (double)m;
    double mean = k + dm;
    double var = sd2 / (double)m - dm * dm;
    if (var < 0.0) var = 0.0; /* rounding only; NaN stays NaN */
    double invstd = 1.0 / sqrt(var + (double)eps);
    float meanf = (float)mean;
    *save_mean = meanf;
    *save_invstd = (float)invstd;
    if (rm) {
        double mom = (double)momentum;
        double unbiased = var * (double)m / (double)(m - 1);
        *rm = (float)((1.0 - mom) * (double)*rm + mom * mean);
        *rv = (float)((1.0 - mom) * (double)*rv + mom * unbiased);
    }
    double s = invstd * (double)gamma;
    *mf = meanf;
    *scale = (float)s;
    *shift = (float)((double)beta - (mean - (double)meanf) * s);
}

/* Per-channel backward from sdy = sum(dy) and sdyd = sum(dy * (x - mean)):
 * writes dgamma/dbeta (= or +=) and returns dx = dy * *a + (x - mean) * *b + *c0. */
static inline void mdl_bn_finish_backward(int64_t m, double sdy, double sdyd, float gamma,
                                          float invstd, float *dgamma, float *dbeta,
                                          int accumulate, float *a, float *b, float *c0)
{
    double is = (double)invstd;
    double dg = sdyd * is;
    if (accumulate) {
        *dgamma = (float)((double)*dgamma + dg);
        *dbeta = (float)((double)*dbeta + sdy);
    } else {
        *dgamma = (float)dg;
        *dbeta = (float)sdy;
    }
    double ga = (double)gamma * is;
    *a = (float)ga;
    *b = (float)(-ga * is * dg / (double)m);
    *c0 = (float)(-ga * sdy / (double)m);
}

/* Inference coefficient: y = (x - running_mean) * scale + beta. */
static inline float mdl_bn_infer_scale(float gamma, float rv, float eps)
{
    return (float)((double)gamma / sqrt((double)rv + (double)eps));
}

void mdl_bn_train_scalar(int64_t n, int64_t c, int64_t hw, int64_t c0, int64_t c1,
                         const float *x, const float *gamma, const float *beta, float eps,
                         float momentum, float *rm, float *rv, float *y, float *save_mean,
                         float *save_invstd);
void mdl_bn_infer_scalar(int64_t n, int64_t c, int64_t hw, int64_t c0, int64_t c1,
                         const float *x, const float *gamma, const float *beta,
                         const float *rm, const float *rv, float eps, float *y);
/* with ms, mt not NULL: the backward of max(BatchNorm(x), 0), dy counting only where
 * x * ms + mt > 0 */
void mdl_bn_backward_scalar(int64_t n, int64_t c, int64_t hw, int64_t c0, int64_t c1,
                            const float *x, const float *gamma, const float *dy,
                            const float *mean, const float *invstd, const float *ms,
                            const float *mt, float *dx, float *dgamma, float *dbeta,
                            int accumulate);
/* mdl_batch_norm_add_relu_backward over the channels [c0, c1) */
void mdl_bn_add_relu_backward_scalar(int64_t n, int64_t c, int64_t hw, int64_t c0, int64_t c1,
                                     const float *s, const float *b, const mdl_affine *fb,
                                     const float *gamma, const float *beta, const float *dy,
                                     const float *invstd, float *dx, float *db, float *dgamma,
                                     float *dbeta, int accumulate);

#if MDL_X86
void mdl_bn_train_avx2(int64_t n, int64_t c, int64_t hw, int64_t c0, int64_t c1,
                       const float *x, const float *gamma, const float *beta, float eps,
                       float momentum, float *rm, float *rv, float *y, float *save_mean,
                       float *save_invstd);
void mdl_bn_infer_avx2(int64_t n, int64_t c, int64_t hw, int64_t c0, int64_t c1,
                       const float *x, const float *gamma, const float *beta,
                       const float *rm, const float *rv, float eps, float *y);
void mdl_bn_backward_avx2(int64_t n, int64_t c, int64_t hw, int64_t c0, int64_t c1,
                          const float *x, const float *gamma, const float *dy,
                          const float *mean, const float *invstd, const float *ms,
                          const float *mt, float *dx, float *dgamma, float *dbeta,
                          int accumulate);
void mdl_bn_add_relu_backward_avx2(int64_t n, int64_t c, int64_t hw, int64_t c0, int64_t c1,
                                   const float *s, const float *b, const mdl_affine *fb,
                                   const float *gamma, const float *beta, const float *dy,
                                   const float *invstd, float *dx, float *db, float *dgamma,
                                   float *dbeta, int accumulate);
#else /* mdl_use_avx2() is never true off x86; these names only keep the dispatch compiling */
#  define mdl_bn_train_avx2 mdl_bn_train_scalar
#  define mdl_bn_infer_avx2 mdl_bn_infer_scalar
#  define mdl_bn_backward_avx2 mdl_bn_backward_scalar
#  define mdl_bn_add_relu_backward_avx2 mdl_bn_add_relu_backward_scalar
#endif
#endif
