/* winograd8_avx2.c -- 3x3 and 5x5 convolutions with stride 1 by Winograd's F(4x4, 3x3)
 * and F(4x4, 5x5), 8 channels to a vector (compiled with -mavx2 -mfma).
 *
 * The method of winograd_avx512.c with AVX2's 8-float vectors, for CPUs without
 * AVX-512, from the same code (winograd_avx512.c's steps, written once in
 * winograd_channels.h): the products keep 12 vectors of outputs in AVX2's 16
 * registers (6 tiles x 16 output channels, or 12 x 8), and a 4x4 tile's outputs go
 * back to NCHW rows by two 8 x 8 transposes. */
#include "common.h"
#if MDL_X86
#include <string.h>
#include <immintrin.h>
#include "simd_avx2.h"
#include "conv.h"

#define VL 8
#define ACC 12
#define CB_MAX 2
#define WINO_NAME(x) mdl_winograd8_##x
typedef __m256 vf;
typedef __m256i vi;
#define v_add _mm256_add_ps
#define v_sub _mm256_sub_ps
#define v_fmadd _mm256_fmadd_ps
#define v_fnmadd _mm256_fnmadd_ps
#define v_max _mm256_max_ps
#define v_set1 _mm256_set1_ps
#define v_mul _mm256_mul_ps
#define v_zero _mm256_setzero_ps
#define v_loadu _mm256_loadu_ps
#define v_storeu _mm256_storeu_ps
#define v_lane_index(stride) \
    _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(stride))
#define v_gather(p, index) _mm256_i32gather_ps(p, index, 4)
#define v_load_first(p, n) \
    ((n) == 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, mdl_lane_mask(0, n)))
#define v_transpose mdl_transpose8_ps

/* o[k], o[8 + k]: channel co + k, its outputs of rows 0-1 and of rows 2-3 */
static inline __attribute__((always_inline)) void v_tile_transpose(__m256 o[16])
{
    mdl_transpose8_ps(o);
    mdl_transpose8_ps(o + 8);
}

static inline __attribute__((always_inline)) void v_tile_rows(const __m256 o[16], int k,
                                                             __m128 rows[4])
{
    rows[0] = _mm256_castps256_ps128(o[k]);
    rows[1] = _mm256_extractf128_ps(o[k], 1);
    rows[2] = _mm256_castps256_ps128(o[8 + k]);
    rows[3] = _mm256_extractf128_ps(o[8 + k], 1);
}

static inline __attribute__((always_inline)) void v_add_to_doubles(double *d, __m256 v)
{
    const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
    const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
    _mm256_storeu_pd(d, _mm256_add_pd(_mm256_loadu_pd(d), lo));
    _mm256_storeu_pd(d + 4, _mm256_add_pd(_mm256_loadu_pd(d + 4), hi));
}

/* the VL channels' sums and sums of squares += those of n values shifted by k:
 * s = sum (x - k), q = sum (x - k)^2 (mdl_add_shifted_sums) */
static inline __attribute__((always_inline)) void v_add_shifted(double *sum, double *sumsq,
                                                               __m256 k, __m256 s, __m256 q,
                                                               double n)
{
    const __m256 in[3] = {k, s, q};
    for (int h = 0; h < 2; h++) {
        __m256d d[3];
        for (int i = 0; i < 3; i++)
            d[i] = _mm256_cvtps_pd(h ? _mm256_extractf128_ps(in[i], 1) : _mm256_castps256_ps128(in[i]));
        const __m256d nk = _mm256_mul_pd(_mm256_set1_pd(n), d[0]);
        _mm256_storeu_pd(sum + 4 * h, _mm256_add_pd(_mm256_loadu_pd(sum + 4 * h), _mm256_add_pd(d[1], nk)));
        const __m256d t = _mm256_fmadd_pd(d[0], _mm256_fmadd_pd(_mm256_set1_pd(2.0), d[1], nk), d[2]);
        _mm256_storeu_pd(sumsq + 4 * h, _mm256_add_pd(_mm256_loadu_pd(sumsq + 4 * h), t));
    }
}

#include "winograd_channels.h"
#endif
