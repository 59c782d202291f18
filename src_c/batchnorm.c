/* batchnorm.c -- BatchNorm over x (n, c, hw): statistics per channel over the
 * m = n * hw values of that channel.  Scalar references here (double sums,
 * two passes); AVX2 versions in batchnorm_avx2.c; argument checks and the
 * OpenMP split over channels in the public functions at the end. */
#include <math.h>
#include "common.h"
#include "batchnorm.h"
#include "checks.h"

/* The hw values of channel ch in image i. */
#define ROW(p, i, ch) ((p) + ((i) * c + (ch)) * hw)

/* ---- scalar references ---------------------------------------------------- */

/* x, y (n, c, hw); gamma, beta, save_mean, save_invstd, rm, rv (c); y overwritten */
void mdl_bn_train_scalar(int64_t n, int64_t c, int64_t hw, int64_t c0, int64_t c1,
                         const float *x, const float *gamma, const float *beta, float eps,
                         float momentum, float *rm, float *rv, float *y, float *save_mean,
                         float *save_invstd)
{
    const int64_t m = n * hw;
    for (int64_t ch = c0; ch < c1; ch++) {
        double s = 0.0;
        for (int64_t i = 0; i < n; i++) {
            const float *p = ROW(x, i, ch);
            for (int64_t j = 0; j < hw; j++) s += p[j];
        }
        const double k = s / (double)m;
        double sd = 0.0, sd2 = 0.0;
        for (int64_t i = 0; i < n; i++) {
            const float *p = ROW(x, i, ch);
            for (int64_t j = 0; j < hw; j++) {
                double d = (double)p[j] - k;
                sd += d;
                sd2 += d * d;
            }
        }
        float mf, scale, shift;
        mdl_bn_finish_train(m, k, sd, sd2, gamma[ch], beta[ch], eps, momentum,
                            rm ? rm + ch : NULL, rv ? rv + ch : NULL, save_mean + ch,
                            save_invstd + ch, &mf, &scale, &shift);
        for (int64_t i = 0; i < n; i++) {
            const float *p = ROW(x, i, ch);
            float *q = ROW(y, i, ch);
            for (int64_t j = 0; j < hw; j++) q[j] = (p[j] - mf) * scale + shift;
        }
    }
}

/* x, y (n, c, hw); y = (x - rm) * gamma / sqrt(rv + eps) + beta, overwritten */
void mdl_bn_infer_scalar(int64_t n, int64_t c, int64_t hw, int64_t c0, int64_t c1,
                         const float *x, const float *gamma, const float *beta,
                         const float *rm, const float *rv, float eps, float *y)
{
    for (int64_t ch = c0; ch < c1; ch++) {
        const float mean = rm[ch], scale = mdl_bn_infer_scale(gamma[ch], rv[ch], eps);
        const float b = beta[ch];
        for (int64_t i = 0; i < n; i++) {
            const float *p = ROW(x, i, ch);
            float *q = ROW(y, i, ch);
            for (int64_t j = 0; j < hw; j++) q[j] = (p[j] - mean) * scale + b;
        }
    }
}

/* x, dy, dx (n, c, hw); dx overwritten, dgamma and dbeta (c) = or += */
/* dy, or 0 where the ReLU after the BatchNorm was 0: x * s + t <= 0 (ms != NULL) */
#define GATE(g, x) (ms && !(fmaf((x), ms[ch], mt[ch]) > 0.0f) ? 0.0f : (g))

/* x, dy, dx (n, c, hw); with ms, mt (not NULL) dy is the gradient of max(y, 0) and
 * counts only where x * ms + mt > 0 */
void mdl_bn_backward_scalar(int64_t n, int64_t c, int64_t hw, int64_t c0, int64_t c1,
                            const float *x, const float *gamma, const float *dy,
                            const float *mean, const float *invstd, const float *ms,
                            const float *mt, float *dx, float *dgamma, float *dbeta,
                            int accumulate)
{
    const int64_t m = n * hw;
    for (int64_t ch = c0; ch < c1; ch++) {
        const float mu = mean[ch];
        double sdy = 0.0, sdyd = 0.0;
        for (int64_t i = 0; i < n; i++) {
            const float *p = ROW(x, i, ch), *g = ROW(dy, i, ch);
            for (int64_t j = 0; j < hw; j++) {
                const float gj = GATE(g[j], p[j]);
                sdy += gj;
                sdyd += (double)gj * (double)(p[j] - mu);
            }
        }
        float a, b, c0f;
        mdl_bn_finish_backward(m, sdy, sdyd, gamma[ch], invstd[ch], dgamma + ch, dbeta + ch,
                               accumulate, &a, &b, &c0f);
        for (int64_t i = 0; i < n; i++) {
            const float *p = ROW(x, i, ch), *g = ROW(dy, i, ch);
            float *q = ROW(dx, i, ch);
            for (int64_t j = 0; j < hw; j++) q[j] = GATE(g[j], p[j]) * a + (p[j] - mu) * b + c0f;
        }
    }
}
#undef GATE

/* s, b, dy, dx, db (n, c, hw): e = s - fb(b) - beta is (x - mean) * gamma * invstd, so
 * x - mean = e * r with r = 1 / (gamma * invstd); g = dy where s > 0 is the gradient of
 * BatchNorm's output.  dx = g * a + e * (r * b') + c0 with mdl_bn_finish_backward's
 * coefficients a, b', c0 from sum(g) and sum(g * e) * r. */
void mdl_bn_add_relu_backward_scalar(int64_t n, int64_t c, int64_t hw, int64_t c0, int64_t c1,
                                     const float *s, const float *b, const mdl_affine *fb,
                                     const float *gamma, const float *beta, const float *dy,
                                     const float *invstd, float *dx, float *db, float *dgamma,
                                     float *dbeta, int accumulate)
{
    const int64_t m = n * hw;
    for (int64_t ch = c0; ch < c1; ch++) {
        const mdl_affine_ch f = mdl_affine_at(fb, ch);
        const float bt = beta[ch];
        double sg = 0.0, sge = 0.0;
        for (int64_t i = 0; i < n; i++) {
            const float *ps = ROW(s, i, ch), *pb = ROW(b, i, ch), *pg = ROW(dy, i, ch);
            float *q = ROW(db, i, ch);
            for (int64_t j = 0; j < hw; j++) {
                const float g = ps[j] > 0.0f ? pg[j] : 0.0f;
                q[j] = g;
                sg += g;
                sge += (double)g * (double)(ps[j] - mdl_affine_apply(pb[j], f) - bt);
            }
        }
        const double r = 1.0 / ((double)gamma[ch] * (double)invstd[ch]);
        float a, bc, k;
        mdl_bn_finish_backward(m, sg, sge * r, gamma[ch], invstd[ch], dgamma + ch, dbeta + ch,
                               accumulate, &a, &bc, &k);
        const float be = (float)((double)bc * r);
        for (int64_t i = 0; i < n; i++) {
            const float *ps = ROW(s, i, ch), *pb = ROW(b, i, ch), *pg = ROW(db, i, ch);
            float *q = ROW(dx, i, ch);
            for (int64_t j = 0; j < hw; j++)
                q[j] = pg[j] * a + (ps[j] - mdl_affine_apply(pb[j], f) - bt) * be + k;
        }
    }
}

/* ---- checks and dispatch -------------------------------------------------- */

/* the checks: mdl_bn_check_* in checks.h */

/* Split the channels into ranges handed out one at a time (mdl_dynamic_chunk).  With
 * hw == 1 the AVX2 kernels sweep 16 channels at a time, so the ranges are cut at
 * multiples of 16.  `passes` counts the sweeps over x. */
#define SPLIT_CHANNELS(passes, body)                                              \
    do {                                                                          \
        const int64_t unit = hw == 1 ? 16 : 1, units = (c + unit - 1) / unit;      \
        int nt = mdl_threads_for((double)n * (double)c * (double)hw * (passes));  \
        if (nt > units) nt = (int)units;                                          \
        const int64_t step = unit * mdl_dynamic_chunk(units, nt);                 \
        _Pragma("omp parallel for schedule(dynamic, 1) num_threads(nt)")          \
        for (int64_t c0 = 0; c0 < c; c0 += step) {                                \
            const int64_t c1 = c0 + step < c ? c0 + step : c;                     \
            body;                                                                 \
        }                                                                         \
    } while (0)

mdl_status mdl_batch_norm_forward_train(int64_t n, int64_t c, int64_t hw, const float *x,
                                        const float *gamma, const float *beta, float eps,
                                        float momentum, float *running_mean, float *running_var,
                                        float *y, float *save_mean, float *save_invstd)
{
    static const char fn[] = "mdl_batch_norm_forward_train";
    mdl_status st = mdl_bn_check_shape(fn, n, c, hw);
    if (st != MDL_OK) return st;
    st = mdl_bn_check_train_args(fn, n, hw, x, gamma, beta, eps, momentum, running_mean,
                                 running_var, y, save_mean, save_invstd);
    if (st != MDL_OK) return st;
    int avx2 = mdl_use_avx2();
    SPLIT_CHANNELS(2.0, if (avx2) mdl_bn_train_avx2(n, c, hw, c0, c1, x, gamma, beta, eps,
                                                    momentum, running_mean, running_var, y,
                                                    save_mean, save_invstd);
                        else mdl_bn_train_scalar(n, c, hw, c0, c1, x, gamma, beta, eps,
                                                 momentum, running_mean, running_var, y,
                                                 save_mean, save_invstd));
    return MDL_OK;
}

mdl_status mdl_batch_norm_forward_infer(int64_t n, int64_t c, int64_t hw, const float *x,
                                        const float *gamma, const float *beta,
                                        const float *running_mean, const float *running_var,
                                        float eps, float *y)
{
    static const char fn[] = "mdl_batch_norm_forward_infer";
    mdl_status st = mdl_bn_check_shape(fn, n, c, hw);
    if (st != MDL_OK) return st;
    st = mdl_bn_check_infer_args(fn, x, gamma, beta, running_mean, running_var, eps, y);
    if (st != MDL_OK) return st;
    int avx2 = mdl_use_avx2();
    SPLIT_CHANNELS(1.0, if (avx2) mdl_bn_infer_avx2(n, c, hw, c0, c1, x, gamma, beta,
                                                    running_mean, running_var, eps, y);
                        else mdl_bn_infer_scalar(n, c, hw, c0, c1, x, gamma, beta,
                                                 running_mean, running_var, eps, y));
    return MDL_OK;
}

static mdl_status backward(const char *fn, int64_t n, int64_t c, int64_t hw, const float *x,
                           const float *gamma, const float *dy, const float *save_mean,
                           const float *save_invstd, const float *ms, const float *mt, float *dx,
                           float *dgamma, float *dbeta, int accumulate)
{
    mdl_status st = mdl_bn_check_shape(fn, n, c, hw);
    if (st != MDL_OK) return st;
    st = mdl_bn_check_backward_args(fn, x, gamma, dy, save_mean, save_invstd, dx, dgamma,
                                    dbeta);
    if (st != MDL_OK) return st;
    int avx2 = mdl_use_avx2();
    SPLIT_CHANNELS(2.0, if (avx2) mdl_bn_backward_avx2(n, c, hw, c0, c1, x, gamma, dy,
                                                       save_mean, save_invstd, ms, mt, dx,
                                                       dgamma, dbeta, accumulate);
                        else mdl_bn_backward_scalar(n, c, hw, c0, c1, x, gamma, dy, save_mean,
                                                    save_invstd, ms, mt, dx, dgamma, dbeta,
                                                    accumulate));
    return MDL_OK;
}

mdl_status mdl_batch_norm_backward(int64_t n, int64_t c, int64_t hw, const float *x,
                                   const float *gamma, const float *dy, const float *save_mean,
                                   const float *save_invstd, float *dx, float *dgamma,
                                   float *dbeta, int accumulate)
{
    return backward(__func__, n, c, hw, x, gamma, dy, save_mean, save_invstd, NULL, NULL, dx,
                    dgamma, dbeta, accumulate);
}

mdl_status mdl_batch_norm_relu_backward(int64_t n, int64_t c, int64_t hw, const float *x,
                                        const float *gamma, const float *dy,
                                        const float *save_mean, const float *save_invstd,
                                        const float *scale, const float *shift, float *dx,
                                        float *dgamma, float *dbeta, int accumulate)
{
    MDL_CHECK_PTR(scale);
    MDL_CHECK_PTR(shift);
    return backward(__func__, n, c, hw, x, gamma, dy, save_mean, save_invstd, scale, shift, dx,
                    dgamma, dbeta, accumulate);
}

mdl_status mdl_batch_norm_add_relu_backward(int64_t n, int64_t c, int64_t hw, const float *s,
                                            const float *b, const mdl_affine *fb,
                                            const float *gamma, const float *beta,
                                            const float *dy, const float *save_invstd,
                                            float *dx, float *db, float *dgamma, float *dbeta,
                                            int accumulate)
{
    static const char fn[] = "mdl_batch_norm_add_relu_backward";
    mdl_status st = mdl_bn_check_shape(fn, n, c, hw);
    if (st != MDL_OK) return st;
    MDL_CHECK_AFFINE(fn, fb, "fb");
    MDL_CHECK_PTR(s);
    MDL_CHECK_PTR(b);
    MDL_CHECK_PTR(beta);
    MDL_CHECK_PTR(db);
    MDL_CHECK_PTR(save_invstd);
    /* the shared check; no mean here, save_invstd stands in for it (checked above) */
    st = mdl_bn_check_backward_args(fn, s, gamma, dy, save_invstd, save_invstd, dx, dgamma,
                                    dbeta);
    if (st != MDL_OK) return st;
    for (int64_t ch = 0; ch < c; ch++)
        MDL_CHECK(gamma[ch] * save_invstd[ch] != 0.0f && isfinite(gamma[ch] * save_invstd[ch]),
                  "%s: x is reconstructed through 1 / (gamma * invstd), which needs it non-zero "
                  "and finite; channel %lld has gamma = %g, invstd = %g", fn, (long long)ch,
                  (double)gamma[ch], (double)save_invstd[ch]);
    int avx2 = mdl_use_avx2();
    SPLIT_CHANNELS(2.0, if (avx2) mdl_bn_add_relu_backward_avx2(n, c, hw, c0, c1, s, b, fb, gamma,
                                                                beta, dy, save_invstd, dx, db,
                                                                dgamma, dbeta, accumulate);
                        else mdl_bn_add_relu_backward_scalar(n, c, hw, c0, c1, s, b, fb, gamma,
                                                             beta, dy, save_invstd, dx, db,
                                                             dgamma, dbeta, accumulate));
    return MDL_OK;
}

/* The statistics from float64 sums: the same arithmetic as the training forward's
 * (mdl_bn_finish_train with the shift K = 0), so that a fused BatchNorm and the
 * plain one differ only by how the sums were added up. */
mdl_status mdl_batch_norm_stats(int64_t c, int64_t count, const double *channel_sum,
                                const double *channel_sumsq, const float *gamma,
                                const float *beta, float eps, float momentum,
                                float *running_mean, float *running_var, float *save_mean,
                                float *save_invstd, float *scale, float *shift)
{
    if (c < 1 || count < 2)
        return mdl_error(MDL_ERR_ARG, "%s: need c >= 1 channels and count > 1 values per "
                         "channel, got c = %lld, count = %lld", __func__, (long long)c,
                         (long long)count);
    if ((running_mean == NULL) != (running_var == NULL))
        return mdl_error(MDL_ERR_ARG, "%s: running_mean and running_var must be given together",
                         __func__);
    MDL_CHECK_PTR(channel_sum);
    MDL_CHECK_PTR(channel_sumsq);
    MDL_CHECK_PTR(gamma);
    MDL_CHECK_PTR(beta);
    MDL_CHECK_PTR(save_mean);
    MDL_CHECK_PTR(save_invstd);
    MDL_CHECK_PTR(scale);
    MDL_CHECK_PTR(shift);
    if (!(eps >= 0.0f && isfinite(eps)) || !(momentum >= 0.0f && momentum <= 1.0f))
        return mdl_error(MDL_ERR_ARG, "%s: need a finite eps >= 0 and 0 <= momentum <= 1, got "
                         "eps = %g, momentum = %g", __func__, (double)eps, (double)momentum);
    for (int64_t ch = 0; ch < c; ch++) {
        float mf;
        mdl_bn_finish_train(count, 0.0, channel_sum[ch], channel_sumsq[ch], gamma[ch], beta[ch],
                            eps, momentum, running_mean ? running_mean + ch : NULL,
                            running_var ? running_var + ch : NULL, save_mean + ch,
                            save_invstd + ch, &mf, scale + ch, shift + ch);
        /* y = (x - mf) * scale + shift  ==  x * scale + (shift - mf * scale) */
        shift[ch] = (float)((double)shift[ch] - (double)mf * (double)scale[ch]);
    }
    return MDL_OK;
}
