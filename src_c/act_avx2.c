/* act_avx2.c -- AVX2 versions of the act.c kernels; compiled with -mavx2 -mfma.
 * Each vector loop is followed by the scalar reference for the tail. */
#include "common.h"
#if MDL_X86
#include <immintrin.h>
#include "act.h"
#include "simd_avx2.h"

void mdl_relu_forward_avx2(int64_t lo, int64_t hi, const float *x, float *y)
{
    const __m256 zero = _mm256_setzero_ps();
    int64_t i = lo;
    for (; i + 8 <= hi; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        /* keep v where !(v < 0): NaN and +0/-0 pass through as the scalar does */
        __m256 neg = _mm256_cmp_ps(v, zero, _CMP_LT_OQ);
        _mm256_storeu_ps(y + i, _mm256_andnot_ps(neg, v));
    }
    mdl_relu_forward_scalar(i, hi, x, y);
}

void mdl_relu_backward_avx2(int64_t lo, int64_t hi, const float *x, const float *dy, float *dx)
{
    const __m256 zero = _mm256_setzero_ps();
    int64_t i = lo;
    for (; i + 8 <= hi; i += 8) {
        __m256 pos = _mm256_cmp_ps(_mm256_loadu_ps(x + i), zero, _CMP_GT_OQ);
        _mm256_storeu_ps(dx + i, _mm256_and_ps(pos, _mm256_loadu_ps(dy + i)));
    }
    mdl_relu_backward_scalar(i, hi, x, dy, dx);
}

void mdl_add_avx2(int64_t lo, int64_t hi, const float *a, const float *b, float *y)
{
    int64_t i = lo;
    for (; i + 8 <= hi; i += 8)
        _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
    mdl_add_scalar(i, hi, a, b, y);
}

/* fa(x) for 8 values: x * s + t, then the ReLU when relu */
static inline __m256 affine8(__m256 x, __m256 s, __m256 t, int relu)
{
    return mdl_relu8(_mm256_fmadd_ps(x, s, t), relu);
}

void mdl_affine_row_avx2(const float *src, int64_t n, mdl_affine_ch g, float *d)
{
    mdl_affine_row8(src, n, g, d);
}

void mdl_affine_add_avx2(int64_t r0, int64_t r1, int64_t c, int64_t hw, const float *a,
                         const mdl_affine *fa, const float *b, const mdl_affine *fb, int relu,
                         float *y)
{
    for (int64_t r = r0; r < r1; r++) {
        const mdl_affine_ch ga = mdl_affine_at(fa, r % c), gb = mdl_affine_at(fb, r % c);
        const __m256 sa = _mm256_set1_ps(ga.s), ta = _mm256_set1_ps(ga.t);
        const __m256 sb = _mm256_set1_ps(gb.s), tb = _mm256_set1_ps(gb.t);
        const float *pa = a + r * hw, *pb = b ? b + r * hw : NULL;
        float *py = y + r * hw;
        int64_t j = 0;
        for (; j + 8 <= hw; j += 8) {
            __m256 v = affine8(_mm256_loadu_ps(pa + j), sa, ta, ga.relu);
            if (pb) v = _mm256_add_ps(v, affine8(_mm256_loadu_ps(pb + j), sb, tb, gb.relu));
            _mm256_storeu_ps(py + j, mdl_relu8(v, relu));
        }
        if (j < hw) mdl_affine_add_scalar(r, r + 1, j, c, hw, a, fa, b, fb, relu, y);
    }
}

static inline __m256i fmix32_v(__m256i h)
{
    h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
    h = _mm256_mullo_epi32(h, _mm256_set1_epi32((int)0x85ebca6bu));
    h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 13));
    h = _mm256_mullo_epi32(h, _mm256_set1_epi32((int)0xc2b2ae35u));
    return _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
}

void mdl_dropout_avx2(int64_t lo, int64_t hi, uint32_t threshold, float scale, uint64_t seed,
                      const float *x, float *y)
{
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i limit = _mm256_set1_epi32((int)threshold - 1); /* hash >> 8 < 2^24: signed compare is safe */
    const __m256 vscale = _mm256_set1_ps(scale);
    int64_t i = lo;
    /* vector blocks must not cross a 2^32 index boundary (the key changes there) */
    for (; i + 8 <= hi && ((uint64_t)i >> 32) == ((uint64_t)(i + 7) >> 32); i += 8) {
        __m256i k = _mm256_set1_epi32((int)mdl_dropout_key(seed, i));
        __m256i idx = _mm256_add_epi32(_mm256_set1_epi32((int)(uint32_t)i), lane);
        __m256i h = fmix32_v(_mm256_add_epi32(fmix32_v(_mm256_xor_si256(idx, k)), k));
        __m256i keep = _mm256_cmpgt_epi32(_mm256_srli_epi32(h, 8), limit);
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), vscale);
        _mm256_storeu_ps(y + i, _mm256_and_ps(_mm256_castsi256_ps(keep), v));
    }
    mdl_dropout_scalar(i, hi, threshold, scale, seed, x, y);
}
#endif
