/* conv_avx512.c -- the weight gradient's dot products with AVX-512F (compiled with
 * -mavx512f -mavx2 -mfma); the contract of mdl_conv_weights_dot_avx2 (conv.h).
 *
 * 16 pixels per vector: two runs of 8 output pixels in raster order (a whole row
 * piece of 16, or the ends of two rows), so dy's 16 are one load and the padded
 * image's one load or two halves.  A block of 4 output channels x 6 rows of K keeps
 * 24 accumulators (of the 32 registers) and does 24 FMAs per 4 + 6 loads (the last
 * rows of K in blocks of 3, 2 or 1), where the
 * AVX2 kernel does 12 per 4 + 3 on 8 pixels: on Zen 4, whose 512-bit FMAs issue as
 * two halves, the arithmetic peak is the same, and the gain is in the loads and
 * instructions per FMA.  Rows a multiple of 16 wide are walked down columns of
 * 16-pixel pieces, with no runs to track. */
#include "common.h"
#if MDL_X86
#include <immintrin.h>
#include "conv.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* 16 pixels: 8 at p and 8 at p + half (half == 8: one load).  lo8: the last run
 * of an odd count, lanes 8-15 zero. */
ALWAYS_INLINE __m512 pixels(const float *p, int64_t half, int lo8)
{
    if (lo8) return _mm512_maskz_loadu_ps(0xFF, p);
    if (half == 8) return _mm512_loadu_ps(p);
    const __m512d lo = _mm512_castpd256_pd512(_mm256_castps_pd(_mm256_loadu_ps(p)));
    return _mm512_castpd_ps(_mm512_insertf64x4(lo, _mm256_castps_pd(_mm256_loadu_ps(p + half)), 1));
}

/* Walks the runs of 8 pixels two at a time: q (offset in dy's plane), o (in the
 * padded plane) and half (from the first run to the second). */
typedef struct runs {
    int64_t q, o, half, oh, ow;
} runs;

ALWAYS_INLINE void runs_start(runs *r, int64_t wo, int64_t wp)
{
    r->q = 0, r->oh = 0, r->ow = 0, r->o = 0;
    r->half = wo >= 16 ? 8 : wp - wo + 8;
}

/* to the next pair: two runs of 8 on */
ALWAYS_INLINE void runs_next(runs *r, int64_t wo, int64_t wp)
{
    r->q += 16;
    for (int s = 0; s < 2; s++) {
        r->ow += 8;
        if (r->ow == wo) r->ow = 0, r->oh++;
    }
    r->o = r->oh * wp + r->ow;
    /* the pair's second run: on this row, or at the start of the next */
    r->half = r->ow + 8 < wo ? 8 : wp - wo + 8;
}

#define ACC(c) __m512 a##c##0 = _mm512_setzero_ps(), a##c##1 = a##c##0, a##c##2 = a##c##0, \
                      a##c##3 = a##c##0, a##c##4 = a##c##0, a##c##5 = a##c##0;
#define FMA1(c, j) \
    if (KB > j) a##c##j = _mm512_fmadd_ps(d, x##j, a##c##j);
#define FMAS(c)                                                              \
    if (CB > c) {                                                            \
        const __m512 d = lo8 ? _mm512_maskz_loadu_ps(0xFF, dy + (co + c) * P + r.q) \
                             : _mm512_loadu_ps(dy + (co + c) * P + r.q);     \
        FMA1(c, 0) FMA1(c, 1) FMA1(c, 2) FMA1(c, 3) FMA1(c, 4) FMA1(c, 5)    \
    }
#define X(j) const __m512 x##j = KB > j ? pixels(xp + off[k + j] + r.o, r.half, lo8) : zero;
#define STORE1(c, j) \
    if (KB > j) pr##c[j] = (first ? 0.0f : pr##c[j]) + _mm512_reduce_add_ps(a##c##j);
#define STORES(c)                                                            \
    if (CB > c) {                                                            \
        float *pr##c = part + (co + c) * ldp + k;                            \
        STORE1(c, 0) STORE1(c, 1) STORE1(c, 2) STORE1(c, 3) STORE1(c, 4) STORE1(c, 5) \
    }

#define ROW_X(j) const __m512 x##j = KB > j ? _mm512_loadu_ps(xr##j + o) : zero;
#define ROW_FMAS(c)                                                          \
    if (CB > c) {                                                            \
        const __m512 d = _mm512_loadu_ps(dr##c + q);                          \
        FMA1(c, 0) FMA1(c, 1) FMA1(c, 2) FMA1(c, 3) FMA1(c, 4) FMA1(c, 5)    \
    }

/* Channels [co, co + CB) x rows [k, k + KB) of K (CB <= 4, KB <= 6; the unused
 * accumulators fold away). */
ALWAYS_INLINE void dot_block(const int CB, const int KB, int64_t co, int64_t k, int64_t c_out, int64_t K,
                             int64_t ho, int64_t wo, int64_t wp, int64_t images,
                             int64_t xp_stride, const float *dy_all, const float *xp_all,
                             const int64_t *off, int first, float *part, int64_t ldp)
{
    const int64_t P = ho * wo, pairs = P / 16;
    const int odd = (P / 8) % 2; /* a last run of 8 alone */
    const __m512 zero = _mm512_setzero_ps();
    ACC(0) ACC(1) ACC(2) ACC(3)
    if (wo % 16 == 0) {
        /* whole 16-pixel pieces of rows: one offset walks the padded plane, one dy's */
        for (int64_t im = 0; im < images; im++) {
            const float *xp = xp_all + im * xp_stride, *dy = dy_all + im * c_out * P + co * P;
            /* (unused rows and channels: the first's, never read) */
            const float *xr0 = xp + off[k], *xr1 = xp + off[k + (KB > 1)],
                        *xr2 = xp + off[k + 2 * (KB > 2)], *xr3 = xp + off[k + 3 * (KB > 3)],
                        *xr4 = xp + off[k + 4 * (KB > 4)], *xr5 = xp + off[k + 5 * (KB > 5)];
            const float *dr0 = dy, *dr1 = dy + P * (CB > 1), *dr2 = dy + 2 * P * (CB > 2),
                        *dr3 = dy + 3 * P * (CB > 3);
            /* down the columns of 16 (a row has few pieces: 2 at 32x32) */
            for (int64_t ow = 0; ow < wo; ow += 16) {
                int64_t o = ow, q = ow;
                for (int64_t oh = 0; oh < ho; oh++, o += wp, q += wo) {
                    ROW_X(0) ROW_X(1) ROW_X(2) ROW_X(3) ROW_X(4) ROW_X(5)
                    ROW_FMAS(0) ROW_FMAS(1) ROW_FMAS(2) ROW_FMAS(3)
                }
            }
        }
        STORES(0) STORES(1) STORES(2) STORES(3)
        return;
    }
    for (int64_t im = 0; im < images; im++) {
        const float *dy = dy_all + im * c_out * P, *xp = xp_all + im * xp_stride;
        runs r;
        runs_start(&r, wo, wp);
        for (int64_t g = 0; g < pairs + odd; g++) {
            const int lo8 = g == pairs;
            X(0) X(1) X(2) X(3) X(4) X(5)
            FMAS(0) FMAS(1) FMAS(2) FMAS(3)
            runs_next(&r, wo, wp);
        }
    }
    STORES(0) STORES(1) STORES(2) STORES(3)
}

void mdl_conv_weights_dot_avx512(int64_t c_out, int64_t K, int64_t ho, int64_t wo, int64_t wp,
                                 int64_t images, int64_t xp_stride, const float *dy_all,
                                 const float *xp_all, const int64_t *off, int first, float *part,
                                 int64_t ldp)
{
    /* channels in blocks of 4 (the last ones alone), rows of K in blocks of 6, then 3,
     * 2 or 1 */
    for (int64_t co = 0; co < c_out;) {
        const int cb = c_out - co >= 4 ? 4 : 1;
        for (int64_t k = 0; k < K;) {
            const int64_t left = K - k;
            const int kb = left >= 6 ? 6 : left >= 3 ? 3 : (int)left;
#define BLOCK(CB, KB) dot_block(CB, KB, co, k, c_out, K, ho, wo, wp, images, xp_stride, dy_all, \
                                xp_all, off, first, part, ldp)
            if (cb == 4) {
                if (kb == 6) BLOCK(4, 6);
                else if (kb == 3) BLOCK(4, 3);
                else if (kb == 2) BLOCK(4, 2);
                else BLOCK(4, 1);
            } else {
                if (kb == 6) BLOCK(1, 6);
                else if (kb == 3) BLOCK(1, 3);
                else if (kb == 2) BLOCK(1, 2);
                else BLOCK(1, 1);
            }
#undef BLOCK
            k += kb;
        }
        co += cb;
    }
}

#endif
