/* winograd_avx512.c -- 3x3 and 5x5 convolutions with stride 1 by Winograd's minimal
 * filtering F(4x4, 3x3) and F(4x4, 5x5), 16 channels to a vector (compiled with
 * -mavx512f).
 *
 * Each 4x4 block of outputs ("tile") comes from the A x A block d of the padded input
 * that starts at its top-left corner (A = 4 + r - 1: 6 for r = 3, 8 for r = 5):
 *     Y = A^T [ (G g G^T) (.) (B^T d B) ] A,
 * A^2 multiplications per channel pair instead of 16 r^2 (36 for 144, 64 for 400).
 * Summed over the input channels, (.) becomes A^2 independent products, one per
 * transform point xi:
 *     M_xi (tiles, c_out) = V_xi (tiles, c_in) @ U_xi (c_in, c_out).
 * F(4x4, 3x3) takes Lavin and Gray's matrices (the points 0, 1, -1, 2, -2 and
 * infinity); F(4x4, 5x5) the points 0, 1, -1, 2, -2, 1/2, -1/2 and infinity, whose B^T
 * is that of F(6x6, 3x3), with G and A^T worked out for it.  In float32 its errors are
 * about 1.4 times those of F(2x2, 5x5), which it replaced (bench/NOTES.md): a tile of
 * 16 outputs takes 64 products where F(2x2, 5x5) took 144.
 *
 * winograd_avx2.c puts tiles in the vectors; its transforms, which gather every
 * other column of the image, cost more than they save below 64 channels.  Here the
 * vectors hold channels, so every transform is plain vector arithmetic on whole
 * registers:
 *   1. the images are transposed to (rows, columns, c_in), zero-padded, the input
 *      map (a BatchNorm's normalisation and ReLU) applied on the way;
 *   2. per chunk of tiles (V and M sized to stay in L2): V = B^T d B per tile and
 *      block of 16 input channels; the A^2 products, register-blocked as 24
 *      vectors of M (tiles x output channels); Y = A^T M A per tile and block of
 *      16 output channels, then bias, ReLU and the channel sums with the channels
 *      in the lanes, and back to NCHW rows (16 x 16 transposes: per row of tiles side
 *      by side, 16 outputs wide, or tile by tile at the edges).
 * Small images go several to a call (mdl_winograd_avx512_group) so that the products
 * have tiles enough to fill their blocks.  The weight gradient is the adjoint of the
 * same steps (winograd_channels.h, which holds the code of both vector widths). */
#include "common.h"
#if MDL_X86
#include <string.h>
#include <immintrin.h>
#include "conv.h"


#define VL 16
#define ACC 24
#define CB_MAX 4
#define WINO_NAME(x) mdl_winograd_avx512_##x
typedef __m512 vf;
typedef __m512i vi;
#define v_add _mm512_add_ps
#define v_sub _mm512_sub_ps
#define v_fmadd _mm512_fmadd_ps
#define v_fnmadd _mm512_fnmadd_ps
#define v_max _mm512_max_ps
#define v_set1 _mm512_set1_ps
#define v_mul _mm512_mul_ps
#define v_zero _mm512_setzero_ps
#define v_loadu _mm512_loadu_ps
#define v_storeu _mm512_storeu_ps
#define v_lane_index(stride)                                                                \
    _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), \
                       _mm512_set1_epi32(stride))
#define v_gather(p, index) _mm512_i32gather_ps(index, p, 4)
#define v_load_first(p, n) _mm512_maskz_loadu_ps((__mmask16)((1u << (n)) - 1), p)
#define v_transpose transpose16
#define v_tile_transpose transpose16 /* o[k]: channel co + k, its 16 outputs row by row */

/* r[i] becomes the column i of the 16 x 16 matrix whose rows were r[0..15] */
static inline __attribute__((always_inline)) void transpose16(__m512 r[16])
{
    __m512 t[16];
    for (int i = 0; i < 8; i++) { /* pairs of rows interleaved within 128-bit lanes */
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) { /* r[4i + c], lane L: rows 4i .. 4i + 3 of column 4L + c */
        r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    for (int c = 0; c < 4; c++) { /* column 4L + c: lane L of r[c], r[4 + c], r[8 + c], r[12 + c] */
        const __m512 a = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88);
        const __m512 b = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xDD);
        const __m512 e = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
        const __m512 f = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xDD);
        t[c] = _mm512_shuffle_f32x4(a, e, 0x88);
        t[8 + c] = _mm512_shuffle_f32x4(a, e, 0xDD);
        t[4 + c] = _mm512_shuffle_f32x4(b, f, 0x88);
        t[12 + c] = _mm512_shuffle_f32x4(b, f, 0xDD);
    }
    for (int i = 0; i < 16; i++) r[i] = t[i];
}

static inline __attribute__((always_inline)) void v_tile_rows(const __m512 o[16], int k,
                                                             __m128 rows[4])
{
    rows[0] = _mm512_castps512_ps128(o[k]);
    rows[1] = _mm512_extractf32x4_ps(o[k], 1);
    rows[2] = _mm512_extractf32x4_ps(o[k], 2);
    rows[3] = _mm512_extractf32x4_ps(o[k], 3);
}

static inline __attribute__((always_inline)) void v_add_to_doubles(double *d, __m512 v)
{
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    _mm512_storeu_pd(d, _mm512_add_pd(_mm512_loadu_pd(d), _mm512_cvtps_pd(_mm512_castps512_ps256(v))));
    _mm512_storeu_pd(d + 8, _mm512_add_pd(_mm512_loadu_pd(d + 8), _mm512_cvtps_pd(hi)));
}

/* the VL channels' sums and sums of squares += those of n values shifted by k:
 * s = sum (x - k), q = sum (x - k)^2 (mdl_add_shifted_sums) */
static inline __attribute__((always_inline)) void v_add_shifted(double *sum, double *sumsq,
                                                               __m512 k, __m512 s, __m512 q,
                                                               double n)
{
    const __m512 in[3] = {k, s, q};
    for (int h = 0; h < 2; h++) {
        __m512d d[3];
        for (int i = 0; i < 3; i++)
            d[i] = _mm512_cvtps_pd(h ? _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(in[i]), 1))
                                     : _mm512_castps512_ps256(in[i]));
        const __m512d nk = _mm512_mul_pd(_mm512_set1_pd(n), d[0]);
        _mm512_storeu_pd(sum + 8 * h, _mm512_add_pd(_mm512_loadu_pd(sum + 8 * h), _mm512_add_pd(d[1], nk)));
        const __m512d t = _mm512_fmadd_pd(d[0], _mm512_fmadd_pd(_mm512_set1_pd(2.0), d[1], nk), d[2]);
        _mm512_storeu_pd(sumsq + 8 * h, _mm512_add_pd(_mm512_loadu_pd(sumsq + 8 * h), t));
    }
}

#include "winograd_channels.h"
#endif
