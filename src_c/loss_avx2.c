/* loss_avx2.c -- AVX2 version of the loss.c kernel; compiled with -mavx2 -mfma.
 * Rows are processed 8 classes at a time; the last partial vector of a row
 * uses masked loads and stores, so every element goes through the same exp. */
#include "common.h"
#if MDL_X86
#include <immintrin.h>
#include "simd_avx2.h"
#include <math.h>
#include "loss.h"

/* exp(x) for 8 floats, about 1 ulp: x = n ln2 + r with |r| <= ln2 / 2,
 * exp(r) = 1 + r + r^2 q(r) with q a degree-4 fit (relative error 4e-9 on
 * that interval), then scaled by 2^n in two halves so that results in the
 * subnormal range round once.  x <= -104 (including -inf) gives 0, large x
 * gives +inf, NaN gives NaN. */
static inline __m256 exp_avx2(__m256 x)
{
    const __m256 lo = _mm256_set1_ps(-104.0f), hi = _mm256_set1_ps(88.8f);
    const __m256 log2e = _mm256_set1_ps(1.442695041f);
    const __m256 ln2_hi = _mm256_set1_ps(6.931471825e-01f);   /* float(ln 2) */
    const __m256 ln2_lo = _mm256_set1_ps(-1.904654212e-09f);  /* ln 2 - ln2_hi */
    const __m256 c2 = _mm256_set1_ps(4.999999404e-01f), c3 = _mm256_set1_ps(1.666652113e-01f),
                 c4 = _mm256_set1_ps(4.166838899e-02f), c5 = _mm256_set1_ps(8.368710056e-03f),
                 c6 = _mm256_set1_ps(1.381461276e-03f);
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256i bias = _mm256_set1_epi32(127);

    __m256 is_nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    __m256 underflow = _mm256_cmp_ps(x, lo, _CMP_LE_OQ);
    __m256 xc = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, log2e),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, ln2_hi, xc);
    r = _mm256_fnmadd_ps(n, ln2_lo, r);
    __m256 q = _mm256_fmadd_ps(c6, r, c5);
    q = _mm256_fmadd_ps(q, r, c4);
    q = _mm256_fmadd_ps(q, r, c3);
    q = _mm256_fmadd_ps(q, r, c2);
    __m256 p = _mm256_add_ps(_mm256_fmadd_ps(q, _mm256_mul_ps(r, r), r), one);
    /* n in [-150, 128]: 2^n = 2^n1 * 2^n2 with both halves normal */
    __m256i ni = _mm256_cvtps_epi32(n);
    __m256i n1 = _mm256_srai_epi32(ni, 1);
    __m256i n2 = _mm256_sub_epi32(ni, n1);
    __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
    y = _mm256_andnot_ps(underflow, y);
    return _mm256_blendv_ps(y, x, is_nan);
}

static inline float hmax(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* 8 floats added into 4 double accumulators (the row sum is kept in double) */
static inline __m256d add_pd8(__m256d acc, __m256 v)
{
    acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
    return _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
}

/* rows [lo, hi) of logits (n, classes) -> sum of row losses; dlogits (n, classes) = */
double mdl_softmax_xent_rows_avx2(int64_t lo, int64_t hi, int64_t classes, const float *logits,
                                  const int64_t *labels, double inv_n, float *dlogits)
{
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const int64_t full = classes & ~(int64_t)7;
    const int rem = (int)(classes - full);
    const __m256i tail = _mm256_cmpgt_epi32(_mm256_set1_epi32(rem), lane);
    const __m256 tailf = _mm256_castsi256_ps(tail);
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    double total = 0.0;
    for (int64_t i = lo; i < hi; i++) {
        const float *z = logits + i * classes;
        const float z_label = z[labels[i]]; /* before d, which may be z, is written */
        float *d = dlogits ? dlogits + i * classes : NULL;

        /* row maximum (a NaN may be skipped here; it still reaches the sum through exp) */
        __m256 vmax = ninf;
        int64_t j = 0;
        for (; j < full; j += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(z + j));
        if (rem) {
            __m256 t = _mm256_blendv_ps(ninf, _mm256_maskload_ps(z + j, tail), tailf);
            vmax = _mm256_max_ps(vmax, t);
        }
        float m = hmax(vmax);

        /* exp(z - m), stored into dlogits when wanted, summed in double */
        const __m256 vm = _mm256_set1_ps(m);
        __m256d acc0 = _mm256_setzero_pd(), acc1 = _mm256_setzero_pd();
        for (j = 0; j + 16 <= full; j += 16) {
            __m256 e0 = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(z + j), vm));
            __m256 e1 = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(z + j + 8), vm));
            if (d) {
                _mm256_storeu_ps(d + j, e0);
                _mm256_storeu_ps(d + j + 8, e1);
            }
            acc0 = add_pd8(acc0, e0);
            acc1 = add_pd8(acc1, e1);
        }
        for (; j < full; j += 8) {
            __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(z + j), vm));
            if (d) _mm256_storeu_ps(d + j, e);
            acc0 = add_pd8(acc0, e);
        }
        if (rem) {
            __m256 e = exp_avx2(_mm256_sub_ps(_mm256_maskload_ps(z + j, tail), vm));
            e = _mm256_and_ps(e, tailf);
            if (d) _mm256_maskstore_ps(d + j, tail, e);
            acc1 = add_pd8(acc1, e);
        }
        double s = mdl_hsum_pd(_mm256_add_pd(acc0, acc1));

        int64_t label = labels[i];
        total += (double)m + log(s) - (double)z_label;
        if (d) {
            double inv_sn = inv_n / s;
            double e_label = d[label];
            const __m256 scale = _mm256_set1_ps((float)inv_sn);
            for (j = 0; j < full; j += 8)
                _mm256_storeu_ps(d + j, _mm256_mul_ps(_mm256_loadu_ps(d + j), scale));
            if (rem)
                _mm256_maskstore_ps(d + j, tail,
                                    _mm256_mul_ps(_mm256_maskload_ps(d + j, tail), scale));
            /* (e - s) / (s n) in double: no cancellation against a rounded softmax */
            d[label] = (float)((e_label - s) * inv_sn);
        }
    }
    return total;
}
#endif
