/* pool_avx512.c -- max pooling of a plane with AVX-512F, for column strides 1 and 2
 * (compiled with -mavx512f -mavx2 -mfma); the contract of mdl_max_pool_plane_avx2.
 *
 * Separable, rows first: each input row's window maxima along the row are taken for 16
 * output columns at a time, tap kx being one load (stride 1) or two loads and a
 * permutation of their even lanes (stride 2), with -inf outside the row (masked loads
 * at its ends); each output row is then the maximum, in row order, of the rows of its
 * window, which a ring of kh row results holds (each input row is reduced once, however
 * many windows share it).  Windows of up to KH_MAX rows that overlap, rows of up to
 * OUT_MAX outputs (mdl_max_pool_avx512_applies).
 *
 * The running maximum is max_ps(v, m) = v > m ? v : m: the reference's rule (a later
 * element wins only when greater) and, rows first, the same winner as its row-major
 * scan: the first maximum of the first row that holds the window's maximum.  It does
 * not keep a NaN as the reference does, so the inputs are also summed, and a plane
 * whose sum is not finite (a NaN, or infinities) is pooled again by the AVX2 kernel,
 * which follows the reference to the bit.  The taps' version (the winner's position in
 * its window) takes the same winners by compare and masked moves. */
#include "common.h"
#if MDL_X86
#include <immintrin.h>
#include <math.h>
#include <string.h>
#include "pool.h"

#define OUT_MAX 256 /* output columns */
#define KH_MAX 8    /* window rows: the ring's size */
#define KW_MAX 8    /* window columns */

/* Where windows share rows (kh > sh), which is what this kernel saves: on 2x2 / 2
 * windows it ran at 0.7-0.9x of the AVX2 kernel, on 3x3 / 2 and 3x3 / 1 at 1.4-6.8x
 * (bench/NOTES.md) */
int mdl_max_pool_avx512_applies(const mdl_pool_geom *g)
{
    return (g->sw == 1 || g->sw == 2) && g->kh > g->sh && g->kh <= KH_MAX && g->kw <= KW_MAX &&
           g->wo <= OUT_MAX;
}

/* the lanes of the 16 columns from c that lie in [0, w) */
static __mmask16 in_row(int64_t c, int64_t w)
{
    const int64_t lo = c < 0 ? -c : 0, hi = w - c < 16 ? w - c : 16;
    return lo < hi ? (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1)) : 0;
}

/* hrow[ow] (ow < wo rounded up to 16) = max over kx of row xr's column ow * S - pw + kx,
 * -inf outside the row, and with TAPS hkx[ow] = its kx: tap kx of output group o loads
 * the 16 columns from o * S - pw + kx (and for S = 2 the next 16) with the lanes
 * mask[o / 16][kx][0 (, 1)] */
static inline __attribute__((always_inline)) void row_maxima(const int S, const int64_t KW,
                                                             const int TAPS,
                                                             const mdl_pool_geom *g,
                                                             const __mmask16 (*mask)[KW_MAX][2],
                                                             const float *xr, float *hrow,
                                                             int32_t *hkx)
{
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    for (int64_t o = 0; o < g->wo; o += 16) {
        const float *p = xr + o * S - g->pw;
        const __mmask16(*k)[2] = mask[o / 16];
#define TAP(kx) (S == 1 ? _mm512_mask_loadu_ps(ninf, k[kx][0], p + (kx))                        \
                        : _mm512_permutex2var_ps(_mm512_mask_loadu_ps(ninf, k[kx][0], p + (kx)), even, \
                                                 _mm512_mask_loadu_ps(ninf, k[kx][1], p + (kx) + 16)))
        __m512 m = TAP(0);
        __m512i t = _mm512_setzero_si512();
        for (int64_t kx = 1; kx < KW; kx++) {
            const __m512 v = TAP(kx);
            if (TAPS) { /* the same rule, with the winner's kx */
                const __mmask16 k = _mm512_cmp_ps_mask(v, m, _CMP_GT_OQ);
                m = _mm512_mask_mov_ps(m, k, v);
                t = _mm512_mask_mov_epi32(t, k, _mm512_set1_epi32((int)kx));
            } else {
                m = _mm512_max_ps(v, m);
            }
        }
#undef TAP
        _mm512_storeu_ps(hrow + o, m);
        if (TAPS) _mm512_storeu_si512(hkx + o, t);
    }
}

static inline __attribute__((always_inline)) int max_plane(const int S, const int64_t KW,
                                                           const int TAPS,
                                                           const mdl_pool_geom *g, const float *x,
                                                           float *y, uint8_t *tap)
{
    float ring[KH_MAX][OUT_MAX];
    int32_t kxs[KH_MAX][OUT_MAX]; /* the winners' kx of the ring's rows (TAPS) */
    __mmask16 mask[OUT_MAX / 16][KW_MAX][2];
    const int64_t w = g->w, wo = g->wo, kh = g->kh;
    for (int64_t o = 0; o < wo; o += 16)
        for (int64_t kx = 0; kx < KW; kx++)
            for (int half = 0; half < 2; half++)
                mask[o / 16][kx][half] = in_row(o * S - g->pw + kx + 16 * half, w);
    const __mmask16 tail = (__mmask16)((1u << (wo & 15)) - 1);
    __m512 sum = _mm512_setzero_ps();
    int64_t next = 0, slot = 0; /* the next input row to reduce, and its place in the ring */
    for (int64_t oh = 0; oh < g->ho; oh++) {
        int64_t hs, he, span;
        mdl_pool_span(oh, g->sh, g->ph, g->kh, g->h, &hs, &he, &span);
        if (next < hs) next = hs, slot = hs % kh;
        for (; next < he; next++, slot = slot + 1 == kh ? 0 : slot + 1) {
            const float *xr = x + next * w;
            int64_t j = 0;
            for (; j + 16 <= w; j += 16) sum = _mm512_add_ps(sum, _mm512_loadu_ps(xr + j));
            if (j < w) sum = _mm512_add_ps(sum, _mm512_maskz_loadu_ps((__mmask16)((1u << (w - j)) - 1), xr + j));
            row_maxima(S, KW, TAPS, g, mask, xr, ring[slot], kxs[slot]);
        }
        /* rows [hs, he) are the last he - hs reduced: hs's place is he - hs before slot */
        const int64_t first = (slot - (he - hs) + kh) % kh;
        float *yrow = y + oh * wo;
        const int64_t r0 = oh * g->sh - g->ph; /* the window's unclipped first row */
        for (int64_t o = 0; o < wo; o += 16) {
            __m512 m = _mm512_loadu_ps(ring[first] + o);
            __m512i t = _mm512_setzero_si512();
            if (TAPS)
                t = _mm512_add_epi32(_mm512_loadu_si512(kxs[first] + o),
                                     _mm512_set1_epi32((int)((hs - r0) * g->kw)));
            for (int64_t r = 1, i = first; r < he - hs; r++) {
                i = i + 1 == kh ? 0 : i + 1;
                const __m512 v = _mm512_loadu_ps(ring[i] + o);
                if (TAPS) {
                    const __mmask16 k = _mm512_cmp_ps_mask(v, m, _CMP_GT_OQ);
                    m = _mm512_mask_mov_ps(m, k, v);
                    t = _mm512_mask_mov_epi32(
                        t, k, _mm512_add_epi32(_mm512_loadu_si512(kxs[i] + o),
                                               _mm512_set1_epi32((int)((hs + r - r0) * g->kw))));
                } else {
                    m = _mm512_max_ps(v, m);
                }
            }
            if (o + 16 <= wo) _mm512_storeu_ps(yrow + o, m);
            else _mm512_mask_storeu_ps(yrow + o, tail, m);
            if (TAPS) { /* the taps as bytes (no byte-masked store without AVX-512BW) */
                uint8_t b[16];
                _mm_storeu_si128((__m128i *)b, _mm512_cvtepi32_epi8(t));
                memcpy(tap + oh * wo + o, b, (size_t)(o + 16 <= wo ? 16 : wo - o));
            }
        }
    }
    return isfinite(_mm512_reduce_add_ps(sum));
}

/* kw 2 and 3 compiled as constants */
#define DISPATCH(TAPS)                                                                     \
    (g->sw == 2 && g->kw == 2   ? max_plane(2, 2, TAPS, g, x, y, tap)                     \
     : g->sw == 2 && g->kw == 3 ? max_plane(2, 3, TAPS, g, x, y, tap)                     \
     : g->sw == 2               ? max_plane(2, g->kw, TAPS, g, x, y, tap)                 \
                                : max_plane(1, g->kw, TAPS, g, x, y, tap))

void mdl_max_pool_plane_avx512(const mdl_pool_geom *g, const float *x, float *y)
{
    uint8_t *tap = NULL;
    if (!DISPATCH(0)) mdl_max_pool_plane_avx2(g, x, y);
}

void mdl_max_pool_tap_plane_avx512(const mdl_pool_geom *g, const float *x, float *y, uint8_t *tap)
{
    if (!DISPATCH(1)) mdl_max_pool_tap_plane_avx2(g, x, y, tap);
}

#endif
