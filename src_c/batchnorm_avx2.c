/* batchnorm_avx2.c -- AVX2 versions of the batchnorm.c kernels; compiled with
 * -mavx2 -mfma.
 *
 * hw >= 2: each channel is swept row by row (hw contiguous values per image),
 * 8 or 16 values per step with a scalar tail.  hw == 1 (input (n, c)): the
 * values of a channel are c apart, so 16 (then 8) neighbouring channels are
 * swept together, one or two vectors per image; the last c % 8 channels of a
 * range go to the scalar reference.
 *
 * The reductions take one pass: the training forward sums d = x - k and d^2
 * with k the mean of the channel's first row (a shift known before the pass),
 * the backward dy and dy * (x - mean).  Each sum runs in float vector
 * accumulators over blocks of at most FLUSH values per lane, then goes into
 * double-precision accumulators (each vector of 8 floats widened into two of
 * 4 doubles), so the rounding error is bounded by the block and the
 * statistics do not degrade with m.  d is exact in float when x is near k.
 *
 * Two sweeps over x are the minimum for the training forward (and over x and
 * dy for the backward) without fusing with the neighbouring layers: every
 * output value needs the channel's statistics, which depend on every input
 * value of the channel.  A channel is swept whole before the next one, so
 * with n * hw * 4 bytes up to about the L2 size the second sweep reads from
 * the cache. */
#include "common.h"
#if MDL_X86
#include <immintrin.h>
#include "simd_avx2.h"
#include "batchnorm.h"

#define ROW(p, i, ch) ((p) + ((i) * c + (ch)) * hw)

/* The first lines of a channel's next row (at most ROW_AHEAD of them), fetched while this
 * one is swept: a channel's rows lie c * hw floats apart, each in a page of its own from
 * 32 x 32 up, where the hardware's prefetchers start over at every row */
#define ROW_AHEAD 8
static inline void prefetch_row(const float *p, int64_t hw)
{
    const int64_t lines = (hw + 15) / 16 < ROW_AHEAD ? (hw + 15) / 16 : ROW_AHEAD;
    for (int64_t l = 0; l < lines; l++) _mm_prefetch((const char *)(p + 16 * l), _MM_HINT_T0);
}

static inline __m256d lo_pd(__m256 v) { return _mm256_cvtps_pd(_mm256_castps256_ps128(v)); }
static inline __m256d hi_pd(__m256 v) { return _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)); }

/* acc += v, v widened to double */
static inline void acc_add(__m256d *lo, __m256d *hi, __m256 v)
{
    *lo = _mm256_add_pd(*lo, lo_pd(v));
    *hi = _mm256_add_pd(*hi, hi_pd(v));
}

/* ---- one channel at a time (hw >= 2) -------------------------------------- */

/* Lanes [0, r) of a vector, r = hw % 8, for the masked tail of a row. */
static inline __m256i tail_mask(int64_t r)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)r), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* Float partial sums are moved into the double accumulators after at most
 * FLUSH values per lane, so their rounding error is bounded by the block, not
 * by m (relative 2^-24 * FLUSH / 2 at worst, far less on average). */
#define FLUSH 64

/* acc (double, 2 x 4 lanes) += f (float, 8 lanes); f = 0 */
static inline void flush(__m256d *lo, __m256d *hi, __m256 *f)
{
    acc_add(lo, hi, *f);
    *f = _mm256_setzero_ps();
}

/* The shift of the one-pass statistics: the mean of the first row (at most 256
 * values) of the channel, so that |mean - k| is a fraction of the standard
 * deviation and sum(d^2) / m - (sum(d) / m)^2 does not cancel. */
static float channel_shift(int64_t hw, const float *row)
{
    const int64_t len = hw < 256 ? hw : 256;
    double s = 0.0;
    for (int64_t j = 0; j < len; j++) s += row[j];
    return (float)(s / (double)len);
}

/* One pass: *sd = sum(x - k), *sd2 = sum((x - k)^2) over the channel.
 * d = x - k in float (exact when x is near k), summed in float over short
 * blocks (two chains each for d and d^2), then in double. */
static void channel_stats(int64_t n, int64_t c, int64_t hw, int64_t ch, const float *x, float k,
                          double *sd, double *sd2)
{
    const __m256 vk = _mm256_set1_ps(k);
    const int64_t full = hw & ~(int64_t)7;
    const __m256i tail = tail_mask(hw - full);
    const __m256 tailf = _mm256_castsi256_ps(tail);
    __m256d s0 = _mm256_setzero_pd(), s1 = s0, q0 = s0, q1 = s0;
    __m256 fs0 = _mm256_setzero_ps(), fs1 = fs0, fq0 = fs0, fq1 = fs0;
    int64_t since = 0; /* values per lane and chain since the last flush */
    for (int64_t i = 0; i < n; i++) {
        const float *p = ROW(x, i, ch);
        /* rows are c * hw apart: the hardware prefetchers start cold on each row (often a
         * page of its own), so the next row is fetched while this one is summed */
        const float *next = i + 1 < n ? ROW(x, i + 1, ch) : p;
        int64_t j = 0;
        for (; j + 16 <= full; j += 16) {
            _mm_prefetch((const char *)(next + j), _MM_HINT_T0);
            __m256 d = _mm256_sub_ps(_mm256_loadu_ps(p + j), vk);
            __m256 e = _mm256_sub_ps(_mm256_loadu_ps(p + j + 8), vk);
            fs0 = _mm256_add_ps(fs0, d);
            fq0 = _mm256_fmadd_ps(d, d, fq0);
            fs1 = _mm256_add_ps(fs1, e);
            fq1 = _mm256_fmadd_ps(e, e, fq1);
            if (++since == FLUSH) {
                flush(&s0, &s1, &fs0), flush(&s0, &s1, &fs1);
                flush(&q0, &q1, &fq0), flush(&q0, &q1, &fq1);
                since = 0;
            }
        }
        if (j < full) {
            __m256 d = _mm256_sub_ps(_mm256_loadu_ps(p + j), vk);
            fs0 = _mm256_add_ps(fs0, d);
            fq0 = _mm256_fmadd_ps(d, d, fq0);
            j += 8;
        }
        if (j < hw) {
            __m256 d = _mm256_and_ps(_mm256_sub_ps(_mm256_maskload_ps(p + j, tail), vk), tailf);
            fs1 = _mm256_add_ps(fs1, d);
            fq1 = _mm256_fmadd_ps(d, d, fq1);
        }
        /* the row's last vectors added at most one value per lane to a chain */
        if ((full & 15) + (hw - full) > 0 && ++since >= FLUSH) {
            flush(&s0, &s1, &fs0), flush(&s0, &s1, &fs1);
            flush(&q0, &q1, &fq0), flush(&q0, &q1, &fq1);
            since = 0;
        }
    }
    flush(&s0, &s1, &fs0), flush(&s0, &s1, &fs1);
    flush(&q0, &q1, &fq0), flush(&q0, &q1, &fq1);
    *sd = mdl_hsum_pd(_mm256_add_pd(s0, s1));
    *sd2 = mdl_hsum_pd(_mm256_add_pd(q0, q1));
}

/* y = (x - mf) * scale + shift over the channel */
static void channel_affine(int64_t n, int64_t c, int64_t hw, int64_t ch, const float *x,
                           float mf, float scale, float shift, float *y)
{
    const __m256 vm = _mm256_set1_ps(mf), vs = _mm256_set1_ps(scale), vb = _mm256_set1_ps(shift);
    const int64_t full = hw & ~(int64_t)7;
    const __m256i tail = tail_mask(hw - full);
    for (int64_t i = 0; i < n; i++) {
        const float *p = ROW(x, i, ch);
        float *q = ROW(y, i, ch);
        int64_t j = 0;
        for (; j < full; j += 8) {
            __m256 d = _mm256_sub_ps(_mm256_loadu_ps(p + j), vm);
            _mm256_storeu_ps(q + j, _mm256_fmadd_ps(d, vs, vb));
        }
        if (j < hw) {
            __m256 d = _mm256_sub_ps(_mm256_maskload_ps(p + j, tail), vm);
            mdl_store_first8(q + j, _mm256_fmadd_ps(d, vs, vb), hw - j);
        }
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
    __m256 vk[MAXV], fs[MAXV], fq[MAXV];
    double sd[8 * MAXV], sd2[8 * MAXV];
    float k[8 * MAXV], mf[8 * MAXV], scale[8 * MAXV], shift[8 * MAXV];
    /* shift: the mean of the first (at most 16) images, then one pass for the sums */
    const int64_t nk = n < 16 ? n : 16;
    for (int v = 0; v < nv; v++) lo[v] = hi[v] = _mm256_setzero_pd();
    for (int64_t i = 0; i < nk; i++)
        for (int v = 0; v < nv; v++)
            acc_add(&lo[v], &hi[v], _mm256_loadu_ps(x + i * c + ch + 8 * v));
    store_pd(sd, lo, hi, nv);
    for (int l = 0; l < 8 * nv; l++) k[l] = (float)(sd[l] / (double)nk);
    for (int v = 0; v < nv; v++) {
        vk[v] = _mm256_loadu_ps(k + 8 * v);
        lo[v] = hi[v] = qlo[v] = qhi[v] = _mm256_setzero_pd();
        fs[v] = fq[v] = _mm256_setzero_ps();
    }
    for (int64_t i0 = 0; i0 < n; i0 += FLUSH) {
        const int64_t i1 = i0 + FLUSH < n ? i0 + FLUSH : n;
        for (int64_t i = i0; i < i1; i++)
            for (int v = 0; v < nv; v++) {
                __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + i * c + ch + 8 * v), vk[v]);
                fs[v] = _mm256_add_ps(fs[v], d);
                fq[v] = _mm256_fmadd_ps(d, d, fq[v]);
            }
        for (int v = 0; v < nv; v++) {
            flush(&lo[v], &hi[v], &fs[v]);
            flush(&qlo[v], &qhi[v], &fq[v]);
        }
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
    __m256 fg[MAXV], fp[MAXV];
    for (int v = 0; v < nv; v++) fg[v] = fp[v] = _mm256_setzero_ps();
    for (int64_t i0 = 0; i0 < n; i0 += FLUSH) {
        const int64_t i1 = i0 + FLUSH < n ? i0 + FLUSH : n;
        for (int64_t i = i0; i < i1; i++)
            for (int v = 0; v < nv; v++) {
                const int64_t o = i * c + ch + 8 * v;
                __m256 g = _mm256_loadu_ps(dy + o);
                __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + o), vm[v]);
                fg[v] = _mm256_add_ps(fg[v], g);
                fp[v] = _mm256_fmadd_ps(g, d, fp[v]);
            }
        for (int v = 0; v < nv; v++) {
            flush(&glo[v], &ghi[v], &fg[v]);
            flush(&plo[v], &phi[v], &fp[v]);
        }
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
        float k = channel_shift(hw, ROW(x, 0, ch));
        double sd, sd2;
        channel_stats(n, c, hw, ch, x, k, &sd, &sd2);
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

/* dy where x * s + t > 0, else 0 (the ReLU's mask, recomputed from x), or dy itself
 * when on is 0 */
static inline __m256 gate(int on, __m256 g, __m256 x, __m256 s, __m256 t)
{
    return on ? _mm256_and_ps(g, _mm256_cmp_ps(_mm256_fmadd_ps(x, s, t), _mm256_setzero_ps(),
                                               _CMP_GT_OQ))
              : g;
}

void mdl_bn_backward_avx2(int64_t n, int64_t c, int64_t hw, int64_t c0, int64_t c1,
                          const float *x, const float *gamma, const float *dy,
                          const float *mean, const float *invstd, const float *ms,
                          const float *mt, float *dx, float *dgamma, float *dbeta, int accumulate)
{
    int64_t ch = c0;
    if (hw == 1 && ms) { /* a masked (n, c) BatchNorm: no fused caller needs it fast */
        mdl_bn_backward_scalar(n, c, hw, c0, c1, x, gamma, dy, mean, invstd, ms, mt, dx, dgamma,
                               dbeta, accumulate);
        return;
    }
    if (hw == 1) {
        for (; ch + 16 <= c1; ch += 16)
            backward_cols(n, c, ch, 2, x, gamma, dy, mean, invstd, dx, dgamma, dbeta, accumulate);
        for (; ch + 8 <= c1; ch += 8)
            backward_cols(n, c, ch, 1, x, gamma, dy, mean, invstd, dx, dgamma, dbeta, accumulate);
        if (ch < c1)
            mdl_bn_backward_scalar(n, c, hw, ch, c1, x, gamma, dy, mean, invstd, NULL, NULL, dx,
                                   dgamma, dbeta, accumulate);
        return;
    }
    const int64_t m = n * hw;
    const int64_t full = hw & ~(int64_t)7;
    const __m256i tail = tail_mask(hw - full);
    const __m256 tailf = _mm256_castsi256_ps(tail);
    for (; ch < c1; ch++) {
        const float mu = mean[ch];
        const __m256 vm = _mm256_set1_ps(mu);
        const int on = ms != NULL;
        const __m256 vs = _mm256_set1_ps(on ? ms[ch] : 0.0f), vt = _mm256_set1_ps(on ? mt[ch] : 0.0f);
        /* one pass for sum(dy) and sum(dy * (x - mean)): float over short blocks, then
         * double, as in channel_stats */
        __m256d g0 = _mm256_setzero_pd(), g1 = g0, p0 = g0, p1 = g0;
        __m256 fg0 = _mm256_setzero_ps(), fg1 = fg0, fp0 = fg0, fp1 = fg0;
        int64_t since = 0;
        for (int64_t i = 0; i < n; i++) {
            const float *p = ROW(x, i, ch), *g = ROW(dy, i, ch);
            if (i + 1 < n) prefetch_row(ROW(x, i + 1, ch), hw), prefetch_row(ROW(dy, i + 1, ch), hw);
            int64_t j = 0;
            for (; j + 16 <= full; j += 16) {
                __m256 xa = _mm256_loadu_ps(p + j), xb = _mm256_loadu_ps(p + j + 8);
                __m256 va = gate(on, _mm256_loadu_ps(g + j), xa, vs, vt);
                __m256 vb = gate(on, _mm256_loadu_ps(g + j + 8), xb, vs, vt);
                fg0 = _mm256_add_ps(fg0, va);
                fp0 = _mm256_fmadd_ps(va, _mm256_sub_ps(xa, vm), fp0);
                fg1 = _mm256_add_ps(fg1, vb);
                fp1 = _mm256_fmadd_ps(vb, _mm256_sub_ps(xb, vm), fp1);
                if (++since == FLUSH) {
                    flush(&g0, &g1, &fg0), flush(&g0, &g1, &fg1);
                    flush(&p0, &p1, &fp0), flush(&p0, &p1, &fp1);
                    since = 0;
                }
            }
            if (j < full) {
                __m256 xa = _mm256_loadu_ps(p + j);
                __m256 va = gate(on, _mm256_loadu_ps(g + j), xa, vs, vt);
                fg0 = _mm256_add_ps(fg0, va);
                fp0 = _mm256_fmadd_ps(va, _mm256_sub_ps(xa, vm), fp0);
                j += 8;
            }
            if (j < hw) {
                /* masked-off lanes: dy = 0, so both products vanish */
                __m256 xb = _mm256_maskload_ps(p + j, tail);
                __m256 vb = gate(on, _mm256_maskload_ps(g + j, tail), xb, vs, vt);
                __m256 d = _mm256_and_ps(_mm256_sub_ps(xb, vm), tailf);
                fg1 = _mm256_add_ps(fg1, vb);
                fp1 = _mm256_fmadd_ps(vb, d, fp1);
            }
            if ((full & 15) + (hw - full) > 0 && ++since >= FLUSH) {
                flush(&g0, &g1, &fg0), flush(&g0, &g1, &fg1);
                flush(&p0, &p1, &fp0), flush(&p0, &p1, &fp1);
                since = 0;
            }
        }
        flush(&g0, &g1, &fg0), flush(&g0, &g1, &fg1);
        flush(&p0, &p1, &fp0), flush(&p0, &p1, &fp1);
        float a, b, k;
        mdl_bn_finish_backward(m, mdl_hsum_pd(_mm256_add_pd(g0, g1)),
                               mdl_hsum_pd(_mm256_add_pd(p0, p1)), gamma[ch], invstd[ch],
                               dgamma + ch, dbeta + ch, accumulate, &a, &b, &k);
        const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b), vc = _mm256_set1_ps(k);
        /* last row first: after the reduction sweep the cache holds the channel's last
         * rows of x and dy (1 MiB at 128x16x32x32, the size of L2), which a first-to-last
         * sweep would evict before reaching them */
        for (int64_t i = n - 1; i >= 0; i--) {
            const float *p = ROW(x, i, ch), *g = ROW(dy, i, ch);
            float *q = ROW(dx, i, ch);
            if (i > 0) {
                prefetch_row(ROW(x, i - 1, ch), hw), prefetch_row(ROW(dy, i - 1, ch), hw);
                prefetch_row(ROW(dx, i - 1, ch), hw);
            }
            int64_t j = 0;
            for (; j < full; j += 8) {
                __m256 xa = _mm256_loadu_ps(p + j), d = _mm256_sub_ps(xa, vm);
                _mm256_storeu_ps(q + j, _mm256_fmadd_ps(gate(on, _mm256_loadu_ps(g + j), xa, vs, vt),
                                                        va, _mm256_fmadd_ps(d, vb, vc)));
            }
            if (j < hw) {
                __m256 xb = _mm256_maskload_ps(p + j, tail), d = _mm256_sub_ps(xb, vm);
                mdl_store_first8(q + j,
                                 _mm256_fmadd_ps(gate(on, _mm256_maskload_ps(g + j, tail), xb,
                                                      vs, vt),
                                                 va, _mm256_fmadd_ps(d, vb, vc)), hw - j);
            }
        }
    }
}
/* The reconstructing backward of max(BatchNorm(x) + fb(b), 0) (batchnorm.c's scalar
 * reference says the arithmetic): one sweep writes db and takes sum(g) and sum(g * e),
 * in float over blocks of at most FLUSH values per lane then double; the second writes dx, last row first. */
void mdl_bn_add_relu_backward_avx2(int64_t n, int64_t c, int64_t hw, int64_t c0, int64_t c1,
                                   const float *s, const float *b, const mdl_affine *fb,
                                   const float *gamma, const float *beta, const float *dy,
                                   const float *invstd, float *dx, float *db, float *dgamma,
                                   float *dbeta, int accumulate)
{
    if (hw < 8) { /* (n, c) or tiny images: no fused caller needs them fast */
        mdl_bn_add_relu_backward_scalar(n, c, hw, c0, c1, s, b, fb, gamma, beta, dy, invstd, dx,
                                        db, dgamma, dbeta, accumulate);
        return;
    }
    const int64_t m = n * hw, full = hw & ~(int64_t)7;
    const __m256i tail = tail_mask(hw - full);
    const __m256 zero = _mm256_setzero_ps();
    for (int64_t ch = c0; ch < c1; ch++) {
        const mdl_affine_ch f = mdl_affine_at(fb, ch);
        const __m256 fs = _mm256_set1_ps(f.s), ft = _mm256_set1_ps(f.t), bt = _mm256_set1_ps(beta[ch]);
#define E(vs, vb) _mm256_sub_ps(_mm256_sub_ps((vs), mdl_relu8(_mm256_fmadd_ps((vb), fs, ft), f.relu)), bt)
        /* two float accumulators per sum (even and odd vectors), moved into double
         * after FLUSH steps */
        __m256d g0 = _mm256_setzero_pd(), g1 = g0, e0 = g0, e1 = g0;
        __m256 fg0 = zero, fg1 = zero, fe0 = zero, fe1 = zero;
        int64_t since = 0;
#define SUMS(vs, vdy, vb, out, FG, FE)                                                   \
        do {                                                                             \
            const __m256 g_ = _mm256_and_ps((vdy), _mm256_cmp_ps((vs), zero, _CMP_GT_OQ)); \
            out;                                                                         \
            FG = _mm256_add_ps(FG, g_);                                                  \
            FE = _mm256_fmadd_ps(g_, E((vs), (vb)), FE);                                 \
        } while (0)
        for (int64_t i = 0; i < n; i++) {
            const float *ps = ROW(s, i, ch), *pb = ROW(b, i, ch), *pg = ROW(dy, i, ch);
            float *q = ROW(db, i, ch);
            if (i + 1 < n) {
                prefetch_row(ROW(s, i + 1, ch), hw), prefetch_row(ROW(b, i + 1, ch), hw);
                prefetch_row(ROW(dy, i + 1, ch), hw), prefetch_row(ROW(db, i + 1, ch), hw);
            }
            int64_t j = 0;
            for (; j + 16 <= full; j += 16) {
                const __m256 va = _mm256_loadu_ps(ps + j), vb = _mm256_loadu_ps(ps + j + 8);
                SUMS(va, _mm256_loadu_ps(pg + j), _mm256_loadu_ps(pb + j),
                     _mm256_storeu_ps(q + j, g_), fg0, fe0);
                SUMS(vb, _mm256_loadu_ps(pg + j + 8), _mm256_loadu_ps(pb + j + 8),
                     _mm256_storeu_ps(q + j + 8, g_), fg1, fe1);
                if (++since == FLUSH) {
                    flush(&g0, &g1, &fg0), flush(&g0, &g1, &fg1);
                    flush(&e0, &e1, &fe0), flush(&e0, &e1, &fe1);
                    since = 0;
                }
            }
            if (j < full) {
                const __m256 va = _mm256_loadu_ps(ps + j);
                SUMS(va, _mm256_loadu_ps(pg + j), _mm256_loadu_ps(pb + j),
                     _mm256_storeu_ps(q + j, g_), fg0, fe0);
                j += 8;
            }
            if (j < hw) { /* masked-off lanes: s = 0, so g = 0 */
                const __m256 va = _mm256_maskload_ps(ps + j, tail);
                SUMS(va, _mm256_maskload_ps(pg + j, tail), _mm256_maskload_ps(pb + j, tail),
                     mdl_store_first8(q + j, g_, hw - j), fg1, fe1);
            }
            if ((hw & 15) && ++since >= FLUSH) {
                flush(&g0, &g1, &fg0), flush(&g0, &g1, &fg1);
                flush(&e0, &e1, &fe0), flush(&e0, &e1, &fe1);
                since = 0;
            }
        }
#undef SUMS
        flush(&g0, &g1, &fg0), flush(&g0, &g1, &fg1);
        flush(&e0, &e1, &fe0), flush(&e0, &e1, &fe1);
        const double r = 1.0 / ((double)gamma[ch] * (double)invstd[ch]);
        float a, bc, k;
        mdl_bn_finish_backward(m, mdl_hsum_pd(_mm256_add_pd(g0, g1)),
                               mdl_hsum_pd(_mm256_add_pd(e0, e1)) * r, gamma[ch], invstd[ch],
                               dgamma + ch, dbeta + ch, accumulate, &a, &bc, &k);
        const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps((float)((double)bc * r)),
                     vk = _mm256_set1_ps(k);
        for (int64_t i = n - 1; i >= 0; i--) {
            const float *ps = ROW(s, i, ch), *pb = ROW(b, i, ch), *pg = ROW(db, i, ch);
            float *q = ROW(dx, i, ch);
            if (i > 0) {
                prefetch_row(ROW(s, i - 1, ch), hw), prefetch_row(ROW(b, i - 1, ch), hw);
                prefetch_row(ROW(db, i - 1, ch), hw), prefetch_row(ROW(dx, i - 1, ch), hw);
            }
            int64_t j = 0;
            for (; j < full; j += 8) {
                const __m256 e = E(_mm256_loadu_ps(ps + j), _mm256_loadu_ps(pb + j));
                _mm256_storeu_ps(q + j, _mm256_fmadd_ps(_mm256_loadu_ps(pg + j), va,
                                                        _mm256_fmadd_ps(e, vb, vk)));
            }
            if (j < hw) {
                const __m256 e = E(_mm256_maskload_ps(ps + j, tail), _mm256_maskload_ps(pb + j, tail));
                mdl_store_first8(q + j, _mm256_fmadd_ps(_mm256_maskload_ps(pg + j, tail), va,
                                                        _mm256_fmadd_ps(e, vb, vk)), hw - j);
            }
        }
#undef E
    }
}
#endif
