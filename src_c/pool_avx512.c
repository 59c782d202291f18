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
 * which follows the reference to the bit. */
#include "common.h"
#if MDL_X86
#include <immintrin.h>
#include <math.h>
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
 * -inf outside the row: tap kx of output group o loads the 16 columns from
 * o * S - pw + kx (and for S = 2 the next 16) with the lanes mask[o / 16][kx][0 (, 1)] */
static inline __attribute__((always_inline)) void row_maxima(const int S, const int64_t KW,
                                                             const mdl_pool_geom *g,
                                                             const __mmask16 (*mask)[KW_MAX][2],
                                                             const float *xr, float *hrow)
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
        for (int64_t kx = 1; kx < KW; kx++) m = _mm512_max_ps(TAP(kx), m);
#undef TAP
        _mm512_storeu_ps(hrow + o, m);
    }
}

static inline __attribute__((always_inline)) int max_plane(const int S, const int64_t KW,
                                                           const mdl_pool_geom *g, const float *x,
                                                           float *y)
{
    float ring[KH_MAX][OUT_MAX];
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
            row_maxima(S, KW, g, mask, xr, ring[slot]);
        }
        /* rows [hs, he) are the last he - hs reduced: hs's place is he - hs before slot */
        const int64_t first = (slot - (he - hs) + kh) % kh;
        float *yrow = y + oh * wo;
        for (int64_t o = 0; o < wo; o += 16) {
            __m512 m = _mm512_loadu_ps(ring[first] + o);
            for (int64_t r = 1, i = first; r < he - hs; r++) {
                i = i + 1 == kh ? 0 : i + 1;
                m = _mm512_max_ps(_mm512_loadu_ps(ring[i] + o), m);
            }
            if (o + 16 <= wo) _mm512_storeu_ps(yrow + o, m);
            else _mm512_mask_storeu_ps(yrow + o, tail, m);
        }
    }
    return isfinite(_mm512_reduce_add_ps(sum));
}

void mdl_max_pool_plane_avx512(const mdl_pool_geom *g, const float *x, float *y)
{
    int finite;
    if (g->sw == 2 && g->kw == 2) finite = max_plane(2, 2, g, x, y);
    else if (g->sw == 2 && g->kw == 3) finite = max_plane(2, 3, g, x, y);
    else if (g->sw == 2) finite = max_plane(2, g->kw, g, x, y);
    else finite = max_plane(1, g->kw, g, x, y);
    if (!finite) mdl_max_pool_plane_avx2(g, x, y);
}

#endif
