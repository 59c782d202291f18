/* simd_avx2.h -- small AVX2 helpers shared by the *_avx2.c and *_avx512.c files (include only there). */
#ifndef MDL_SIMD_AVX2_H
#define MDL_SIMD_AVX2_H
#include <immintrin.h>
#include <stdint.h>
#include "common.h"

/* max(v, 0) when relu, keeping NaN (as mdl_relu_forward) */
static inline __m256 mdl_relu8(__m256 v, int relu)
{
    return relu ? _mm256_andnot_ps(_mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_LT_OQ), v) : v;
}

/* d[0, n) = src[0, n) read through one channel's map g (mdl_affine_apply); d may
 * equal src */
static inline void mdl_affine_row8(const float *src, int64_t n, mdl_affine_ch g, float *d)
{
    const __m256 s = _mm256_set1_ps(g.s), t = _mm256_set1_ps(g.t);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(d + j, mdl_relu8(_mm256_fmadd_ps(_mm256_loadu_ps(src + j), s, t), g.relu));
    for (; j < n; j++) d[j] = mdl_affine_apply(src[j], g);
}

/* d[0, count) = the first count lanes of v (count clamped to [0, 8]), without vmaskmovps: AMD's
 * Zen cores take it microcoded, about a dozen cycles per store, which dominated the
 * column matrices of 4x4 images (16-float rows, a masked store per 4 floats) */
static inline void mdl_store_first8(float *d, __m256 v, int64_t count)
{
    if (count >= 8) {
        _mm256_storeu_ps(d, v);
        return;
    }
    if (count <= 0) return;
    __m128 q = _mm256_castps256_ps128(v);
    if (count & 4) {
        _mm_storeu_ps(d, q);
        d += 4;
        q = _mm256_extractf128_ps(v, 1);
    }
    if (count & 2) {
        _mm_storel_pi((__m64 *)d, q);
        d += 2;
        q = _mm_movehl_ps(q, q);
    }
    if (count & 1) _mm_store_ss(d, q);
}

/* lanes l of 0..7 with lo <= l < hi, as a mask for maskload / maskstore */
static inline __m256i mdl_lane_mask(int64_t lo, int64_t hi)
{
    lo = lo < 0 ? 0 : lo > 8 ? 8 : lo;
    hi = hi < 0 ? 0 : hi > 8 ? 8 : hi;
    __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_and_si256(_mm256_cmpgt_epi32(idx, _mm256_set1_epi32((int)lo - 1)),
                            _mm256_cmpgt_epi32(_mm256_set1_epi32((int)hi), idx));
}

/* the even elements of a then b: a0 a2 a4 a6 b0 b2 b4 b6 */
static inline __m256 mdl_even_lanes(__m256 a, __m256 b)
{
    __m256 e = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)); /* a0 a2 b0 b2 | a4 a6 b4 b6 */
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), _MM_SHUFFLE(3, 1, 2, 0)));
}

/* the odd elements of a then b: a1 a3 a5 a7 b1 b3 b5 b7 */
static inline __m256 mdl_odd_lanes(__m256 a, __m256 b)
{
    __m256 e = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1)); /* a1 a3 b1 b3 | a5 a7 b5 b7 */
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), _MM_SHUFFLE(3, 1, 2, 0)));
}

/* In-register transpose of 8 rows of 8 floats. */
static inline void mdl_transpose8_ps(__m256 r[8])
{
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
    r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
    r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
    r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
    r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
    r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
    r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

/* sum of the 8 lanes */
static inline float mdl_hsum_ps(__m256 v)
{
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}

/* sum of the 4 lanes */
static inline double mdl_hsum_pd(__m256d v)
{
    __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

/* sum of p[0, count) in float: four independent 8-lane accumulators, scalar tail */
static inline float mdl_sum_ps(const float *p, int64_t count)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 32 <= count; i += 32) {
        a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i));
        a1 = _mm256_add_ps(a1, _mm256_loadu_ps(p + i + 8));
        a2 = _mm256_add_ps(a2, _mm256_loadu_ps(p + i + 16));
        a3 = _mm256_add_ps(a3, _mm256_loadu_ps(p + i + 24));
    }
    for (; i + 8 <= count; i += 8) a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i));
    float sum = mdl_hsum_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < count; i++) sum += p[i];
    return sum;
}
#endif
