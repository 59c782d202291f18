/* batchnorm_avx2.c -- AVX2 versions of the batchnorm.c kernels; compiled with
 * -mavx2 -mfma.
 *
 * hw >= 2: each channel is swept row by row (hw contiguous values per image),
 * 8 or 16 values per step with a scalar tail.  hw == 1 (input (n, c)): the
 * values of a channel are c apart, so 16 (then 8) neighbouring channels are
 * swept together, one or two vectors per image; the last c % 8 channels of a
 * range go to the scalar reference.
 *
 * Sums of float values go into double-precision vector accumulators (each
 * vector of 8 floats is widened into two of 4 doubles), so the statistics do
 * not degrade with m.  The variance pass sums d = x - k with k the first-pass
 * mean rounded to float: d is computed exactly in float when x is near k. */
#include "common.h"
#if MDL_X86
#include <immintrin.h>
#include "simd_avx2.h"
#include "batchnorm.h"

#define ROW(p, i, ch) ((p) + ((i) * c + (ch)) * hw)

static inline __m256d lo_pd(__m256 v) { return _mm256_cvtps_pd(_mm256_castps256_ps128(v)); }
static inline __m256d hi_pd(__m256 v) { return _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)); }

/* acc += v, v widened to double */
static inline void acc_add(__m256d *lo, __m256d *hi, __m256 v)
{
    *lo = _mm256_add_pd(*lo, lo_pd(v));
    *hi = _mm256_add_pd(*hi, hi_pd(v));
}

/* acc += v * v, v widened to double */
static inline void acc_sq(__m256d *lo, __m256d *hi, __m256 v)
{
    __m256d l = lo_pd(v), h = hi_pd(v);
    *lo = _mm256_fmadd_pd(l, l, *lo);
    *hi = _mm256_fmadd_pd(h, h, *hi);
}

/* ---- one channel at a time (hw >= 2) -------------------------------------- */

/* sum of the channel's n * hw values */
static double channel_sum(int64_t n, int64_t c, int64_t hw, int64_t ch, const float *x)
{
    __m256d a0 = _mm256_setzero_pd(), a1 = a0, b0 = a0, b1 = a0;
    double tail = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const float *p = ROW(x, i, ch);
        int64_t j = 0;
        for (; j + 16 <= hw; j += 16) {
            acc_add(&a0, &a1, _mm256_loadu_ps(p + j));
            acc_add(&b0, &b1, _mm256_loadu_ps(p + j + 8));
        }
        for (; j + 8 <= hw; j += 8) acc_add(&a0, &a1, _mm256_loadu_ps(p + j));
        for (; j < hw; j++) tail += p[j];
    }
    return mdl_hsum_pd(_mm256_add_pd(_mm256_add_pd(a0, a1), _mm256_add_pd(b0, b1))) + tail;
}

/* *sd = sum(x - k), *sd2 = sum((x - k)^2) over the channel */
static void channel_dev(int64_t n, int64_t c, int64_t hw, int64_t ch, const float *x, float k,
                        double *sd, double *sd2)
{
    const __m256 vk = _mm256_set1_ps(k);
    __m256d s0 = _mm256_setzero_pd(), s1 = s0, q0 = s0, q1 = s0;
    __m256d t0 = s0, t1 = s0, r0 = s0, r1 = s0;
    double ts = 0.0, tq = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const float *p = ROW(x, i, ch);
        int64_t j = 0;
        for (; j + 16 <= hw; j += 16) {
            __m256 d = _mm256_sub_ps(_mm256_loadu_ps(p + j), vk);
            __m256 e = _mm256_sub_ps(_mm256_loadu_ps(p + j + 8), vk);
            acc_add(&s0, &s1, d);
            acc_sq(&q0, &q1, d);
            acc_add(&t0, &t1, e);
            acc_sq(&r0, &r1, e);
        }
        for (; j + 8 <= hw; j += 8) {
            __m256 d = _mm256_sub_ps(_mm256_loadu_ps(p + j), vk);
            acc_add(&s0, &s1, d);
            acc_sq(&q0, &q1, d);
        }
        for (; j < hw; j++) {
            double d = (double)(p[j] - k);
            ts += d;
            tq += d * d;
        }
    }
    *sd = mdl_hsum_pd(_mm256_add_pd(_mm256_add_pd(s0, s1), _mm256_add_pd(t0, t1))) + ts;
    *sd2 = mdl_hsum_pd(_mm256_add_pd(_mm256_add_pd(q0, q1), _mm256_add_pd(r0, r1))) + tq;
}

/* y = (x - mf) * scale + shift over the channel */
static void channel_affine(int64_t n, int64_t c, int64_t hw, int64_t ch, const float *x,
                           float mf, float scale, float shift, float *y)
{
    const __m256 vm = _mm256_set1_ps(mf), vs = _mm256_set1_ps(scale), vb = _mm256_set1_ps(shift);
    for (int64_t i = 0; i < n; i++) {
        const float *p = ROW(x, i, ch);
        float *q = ROW(y, i, ch);
        int64_t j = 0;
        for (; j + 8 <= hw; j += 8) {
            __m256 d = _mm256_sub_ps(_mm256_loadu_ps(p + j), vm);
            _mm256_storeu_ps(q + j, _mm256_fmadd_ps(d, vs, vb));
        }
        for (; j < hw; j++) q[j] = (p[j] - mf) * scale + shift;
    }
}

/* ---- 8 * nv channels at a time (hw == 1: x is (n, c)) ------------------------ */

/* These read x[i * c + ch .. + 8 * nv) for i < n, nv = 1 or 2 (a compile-time
 * constant after inlining): 16 channels fill a 64-byte cache line per image. */
#define MAXV 2
#define INLINE static inline __attribute__((always_inline))

INLINE void store_pd(double *out, const __m256d *lo, const __m256d *hi, int nv)
{
    for (int v = 0; v < nv; v++) {
        _mm256_storeu_pd(out + 8 * v, lo[v]);
        _mm256_storeu_pd(out + 8 * v + 4, hi[v]);
    }
}

INLINE void train_cols(int64_t n, int64_t c, int64_t ch, int nv, const float *x,
                       const float *gamma, const float *beta, float eps, float momentum,
                       float *rm, float *rv, float *y, float *save_mean, float *save_invstd)
{
    __m256d lo[MAXV], hi[MAXV], qlo[MAXV], qhi[MAXV];
    __m256 vk[MAXV];
    double s[8 * MAXV], sd[8 * MAXV], sd2[8 * MAXV];
    float k[8 * MAXV], mf[8 * MAXV], scale[8 * MAXV], shift[8 * MAXV];
    for (int v = 0; v < nv; v++) lo[v] = hi[v] = _mm256_setzero_pd();
    for (int64_t i = 0; i < n; i++)
        for (int v = 0; v < nv; v++)
            acc_add(&lo[v], &hi[v], _mm256_loadu_ps(x + i * c + ch + 8 * v));
    store_pd(s, lo, hi, nv);
    for (int l = 0; l < 8 * nv; l++) k[l] = (float)(s[l] / (double)n);
    for (int v = 0; v < nv; v++) {
        vk[v] = _mm256_loadu_ps(k + 8 * v);
        lo[v] = hi[v] = qlo[v] = qhi[v] = _mm256_setzero_pd();
    }
    for (int64_t i = 0; i < n; i++)
        for (int v = 0; v < nv; v++) {
            __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + i * c + ch + 8 * v), vk[v]);
            acc_add(&lo[v], &hi[v], d);
            acc_sq(&qlo[v], &qhi[v], d);
        }
    store_pd(sd, lo, hi, nv);
    store_pd(sd2, qlo, qhi, nv);
    for (int l = 0; l < 8 * nv; l++)
        mdl_bn_finish_train(n, (double)k[l], sd[l], sd2[l], gamma[ch + l], beta[ch + l], eps,
                            momentum, rm ? rm + ch + l : NULL, rv ? rv + ch + l : NULL,
                            save_mean + ch + l, save_invstd + ch + l, mf + l, scale + l,
                            shift + l);
    __m256 vm[MAXV], vs[MAXV], vb[MAXV];
    for (int v = 0; v < nv; v++) {
        vm[v] = _mm256_loadu_ps(mf + 8 * v);
        vs[v] = _mm256_loadu_ps(scale + 8 * v);
        vb[v] = _mm256_loadu_ps(shift + 8 * v);
    }
    for (int64_t i = 0; i < n; i++)
        for (int v = 0; v < nv; v++) {
            const int64_t o = i * c + ch + 8 * v;
            __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + o), vm[v]);
            _mm256_storeu_ps(y + o, _mm256_fmadd_ps(d, vs[v], vb[v]));
        }
}

INLINE void infer_cols(int64_t n, int64_t c, int64_t ch, int nv, const float *x,
                       const float *gamma, const float *beta, const float *rm, const float *rv,
                       float eps, float *y)
{
    float scale[8 * MAXV];
    __m256 vm[MAXV], vs[MAXV], vb[MAXV];
    for (int l = 0; l < 8 * nv; l++) scale[l] = mdl_bn_infer_scale(gamma[ch + l], rv[ch + l], eps);
    for (int v = 0; v < nv; v++) {
        vm[v] = _mm256_loadu_ps(rm + ch + 8 * v);
        vs[v] = _mm256_loadu_ps(scale + 8 * v);
        vb[v] = _mm256_loadu_ps(beta + ch + 8 * v);
    }
    for (int64_t i = 0; i < n; i++)
        for (int v = 0; v < nv; v++) {
            const int64_t o = i * c + ch + 8 * v;
            __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + o), vm[v]);
            _mm256_storeu_ps(y + o, _mm256_fmadd_ps(d, vs[v], vb[v]));
        }
}

INLINE void backward_cols(int64_t n, int64_t c, int64_t ch, int nv, const float *x,
                          const float *gamma, const float *dy, const float *mean,
                          const float *invstd, float *dx, float *dgamma, float *dbeta,
                          int accumulate)
{
    __m256d glo[MAXV], ghi[MAXV], plo[MAXV], phi[MAXV];
    __m256 vm[MAXV];
    for (int v = 0; v < nv; v++) {
        vm[v] = _mm256_loadu_ps(mean + ch + 8 * v);
        glo[v] = ghi[v] = plo[v] = phi[v] = _mm256_setzero_pd();
    }
    for (int64_t i = 0; i < n; i++)
        for (int v = 0; v < nv; v++) {
            const int64_t o = i * c + ch + 8 * v;
            __m256 g = _mm256_loadu_ps(dy + o);
            __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + o), vm[v]);
            acc_add(&glo[v], &ghi[v], g);
            acc_add(&plo[v], &phi[v], _mm256_mul_ps(g, d));
        }
    double sdy[8 * MAXV], sdyd[8 * MAXV];
    float a[8 * MAXV], b[8 * MAXV], k[8 * MAXV];
    store_pd(sdy, glo, ghi, nv);
    store_pd(sdyd, plo, phi, nv);
    for (int l = 0; l < 8 * nv; l++)
        mdl_bn_finish_backward(n, sdy[l], sdyd[l], gamma[ch + l], invstd[ch + l],
                               dgamma + ch + l, dbeta + ch + l, accumulate, a + l, b + l, k + l);
    __m256 va[MAXV], vb[MAXV], vc[MAXV];
    for (int v = 0; v < nv; v++) {
        va[v] = _mm256_loadu_ps(a + 8 * v);
        vb[v] = _mm256_loadu_ps(b + 8 * v);
        vc[v] = _mm256_loadu_ps(k + 8 * v);
    }
    for (int64_t i = 0; i < n; i++)
        for (int v = 0; v < nv; v++) {
            const int64_t o = i * c + ch + 8 * v;
            __m256 g = _mm256_loadu_ps(dy + o);
            __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + o), vm[v]);
            _mm256_storeu_ps(dx + o, _mm256_fmadd_ps(g, va[v], _mm256_fmadd_ps(d, vb[v], vc[v])));
        }
}

/* ---- kernels ------------------------------------------------------------------ */

void mdl_bn_train_avx2(int64_t n, int64_t c, int64_t hw, int64_t c0, int64_t c1,
                       const float *x, const float *gamma, const float *beta, float eps,
                       float momentum, float *rm, float *rv, float *y, float *save_mean,
                       float *save_invstd)
{
    int64_t ch = c0;
    if (hw == 1) {
        for (; ch + 16 <= c1; ch += 16)
            train_cols(n, c, ch, 2, x, gamma, beta, eps, momentum, rm, rv, y, save_mean,
                       save_invstd);
        for (; ch + 8 <= c1; ch += 8)
            train_cols(n, c, ch, 1, x, gamma, beta, eps, momentum, rm, rv, y, save_mean,
                       save_invstd);
        if (ch < c1)
            mdl_bn_train_scalar(n, c, hw, ch, c1, x, gamma, beta, eps, momentum, rm, rv, y,
                                save_mean, save_invstd);
        return;
    }
    const int64_t m = n * hw;
    for (; ch < c1; ch++) {
        float k = (float)(channel_sum(n, c, hw, ch, x) / (double)m);
        double sd, sd2;
        channel_dev(n, c, hw, ch, x, k, &sd, &sd2);
        float mf, scale, shift;
        mdl_bn_finish_train(m, (double)k, sd, sd2, gamma[ch], beta[ch], eps, momentum,
                            rm ? rm + ch : NULL, rv ? rv + ch : NULL, save_mean + ch,
                            save_invstd + ch, &mf, &scale, &shift);
        channel_affine(n, c, hw, ch, x, mf, scale, shift, y);
    }
}

void mdl_bn_infer_avx2(int64_t n, int64_t c, int64_t hw, int64_t c0, int64_t c1,
                       const float *x, const float *gamma, const float *beta,
                       const float *rm, const float *rv, float eps, float *y)
{
    int64_t ch = c0;
    if (hw == 1) {
        for (; ch + 16 <= c1; ch += 16) infer_cols(n, c, ch, 2, x, gamma, beta, rm, rv, eps, y);
        for (; ch + 8 <= c1; ch += 8) infer_cols(n, c, ch, 1, x, gamma, beta, rm, rv, eps, y);
        if (ch < c1) mdl_bn_infer_scalar(n, c, hw, ch, c1, x, gamma, beta, rm, rv, eps, y);
        return;
    }
    for (; ch < c1; ch++)
        channel_affine(n, c, hw, ch, x, rm[ch], mdl_bn_infer_scale(gamma[ch], rv[ch], eps),
                       beta[ch], y);
}

void mdl_bn_backward_avx2(int64_t n, int64_t c, int64_t hw, int64_t c0, int64_t c1,
                          const float *x, const float *gamma, const float *dy,
                          const float *mean, const float *invstd, float *dx, float *dgamma,
                          float *dbeta, int accumulate)
{
    int64_t ch = c0;
    if (hw == 1) {
        for (; ch + 16 <= c1; ch += 16)
            backward_cols(n, c, ch, 2, x, gamma, dy, mean, invstd, dx, dgamma, dbeta, accumulate);
        for (; ch + 8 <= c1; ch += 8)
            backward_cols(n, c, ch, 1, x, gamma, dy, mean, invstd, dx, dgamma, dbeta, accumulate);
        if (ch < c1)
            mdl_bn_backward_scalar(n, c, hw, ch, c1, x, gamma, dy, mean, invstd, dx, dgamma,
                                   dbeta, accumulate);
        return;
    }
    const int64_t m = n * hw;
    for (; ch < c1; ch++) {
        const float mu = mean[ch];
        const __m256 vm = _mm256_set1_ps(mu);
        __m256d g0 = _mm256_setzero_pd(), g1 = g0, p0 = g0, p1 = g0;
        double tg = 0.0, tp = 0.0;
        for (int64_t i = 0; i < n; i++) {
            const float *p = ROW(x, i, ch), *g = ROW(dy, i, ch);
            int64_t j = 0;
            for (; j + 8 <= hw; j += 8) {
                __m256 vg = _mm256_loadu_ps(g + j);
                __m256 d = _mm256_sub_ps(_mm256_loadu_ps(p + j), vm);
                acc_add(&g0, &g1, vg);
                acc_add(&p0, &p1, _mm256_mul_ps(vg, d));
            }
            for (; j < hw; j++) {
                tg += g[j];
                tp += (double)g[j] * (double)(p[j] - mu);
            }
        }
        float a, b, k;
        mdl_bn_finish_backward(m, mdl_hsum_pd(_mm256_add_pd(g0, g1)) + tg,
                               mdl_hsum_pd(_mm256_add_pd(p0, p1)) + tp, gamma[ch], invstd[ch],
                               dgamma + ch, dbeta + ch, accumulate, &a, &b, &k);
        const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b), vc = _mm256_set1_ps(k);
        for (int64_t i = 0; i < n; i++) {
            const float *p = ROW(x, i, ch), *g = ROW(dy, i, ch);
            float *q = ROW(dx, i, ch);
            int64_t j = 0;
            for (; j + 8 <= hw; j += 8) {
                __m256 d = _mm256_sub_ps(_mm256_loadu_ps(p + j), vm);
                _mm256_storeu_ps(q + j, _mm256_fmadd_ps(_mm256_loadu_ps(g + j), va,
                                                        _mm256_fmadd_ps(d, vb, vc)));
            }
            for (; j < hw; j++) q[j] = g[j] * a + (p[j] - mu) * b + k;
        }
    }
}
#endif
