/* pool_avx2.c -- AVX2 versions of the pool.c plane kernels; compiled with -mavx2 -mfma.
 *
 * Each output row is split into the left border, the interior (windows that
 * lie inside the row in full) and the right border.  The interior is done 8
 * output columns at a time: lane j holds column ow + j, whose window starts at
 * input column (ow + j) * sw - pw, so a window tap (ih, kx) is one load of 8
 * input values spaced sw apart -- a plain load for stride 1, two loads and a
 * deinterleave for stride 2, a gather otherwise.  Window rows are clipped per
 * output row, the same for every lane.  Max pooling covers whole rows (at least
 * 8 columns) in groups of 8, the last group overlapping the one before; groups
 * at the row's ends mask the taps outside the row.  Average pooling goes
 * through a row buffer (see avg_plane_rows); its backward is organised
 * differently again (see below).  Other borders use the scalar reference.
 *
 * Max pooling visits the taps in the reference's order with the reference's
 * update rule (greater or NaN, by compare and blend), so its results and its
 * argmax are bit-identical to pool.c. */
#include "common.h"
#if MDL_X86
#include <immintrin.h>
#include "simd_avx2.h"
#include <string.h>
#include "pool.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))

enum { LOAD_S1 = 1, LOAD_S2 = 2, LOAD_GATHER = 0 };

/* the lanes below r set */
static inline __m256i first_lanes(int64_t r)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)r), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* p[0], p[s], ..., p[7 s]; reads nothing outside p[0 .. 7 s]. */
ALWAYS_INLINE __m256 load_strided(const float *p, const int mode, __m256i offsets)
{
    if (mode == LOAD_S1) return _mm256_loadu_ps(p);
    if (mode == LOAD_S2) {
        __m256 a = _mm256_loadu_ps(p);     /* offsets 0..7 */
        __m256 b = _mm256_loadu_ps(p + 7); /* offsets 7..14 */
        /* per 128-bit half: a0 a2 b1 b3 | a4 a6 b5 b7 = offsets 0 2 8 10 | 4 6 12 14 */
        __m256 t = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 2, 0));
        return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(t), _MM_SHUFFLE(3, 1, 2, 0)));
    }
    return _mm256_i32gather_ps(p, offsets, 4);
}

static inline int load_mode(int64_t sw)
{
    return sw == 1 ? LOAD_S1 : sw == 2 ? LOAD_S2 : LOAD_GATHER;
}

static inline __m256i lane_offsets(int64_t sw)
{
    return _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int)sw));
}

/* Lanes whose column lies in [0, w). */
ALWAYS_INLINE __m256i in_row(__m256i cols, __m256i wv)
{
    return _mm256_andnot_si256(_mm256_cmpgt_epi32(_mm256_setzero_si256(), cols),
                               _mm256_cmpgt_epi32(wv, cols));
}

/* The lanes of a tap at the row's ends that lie in [0, w): ok for the 8 values the
 * tap takes (columns c0 + l s), a and b for the two loads of the stride-2 mode. */
typedef struct tap_masks {
    __m256i ok, a, b;
} tap_masks;

ALWAYS_INLINE tap_masks tap_masks_at(int64_t c0, __m256i offs, __m256i wv)
{
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i base = _mm256_set1_epi32((int)c0);
    tap_masks t;
    t.ok = in_row(_mm256_add_epi32(base, offs), wv);
    t.a = in_row(_mm256_add_epi32(base, lane), wv);
    t.b = in_row(_mm256_add_epi32(base, _mm256_add_epi32(lane, _mm256_set1_epi32(7))), wv);
    return t;
}

/* As load_strided, for windows at the row's ends: lane l is p[l s] where its
 * column lies in [0, w) (masks t), else -inf; nothing outside the row is read
 * (masked loads), so p may point before the row. */
ALWAYS_INLINE __m256 load_strided_masked(const float *p, const int mode, __m256i offs,
                                         const tap_masks *t)
{
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    if (mode == LOAD_S1)
        return _mm256_blendv_ps(ninf, _mm256_maskload_ps(p, t->ok), _mm256_castsi256_ps(t->ok));
    if (mode == LOAD_S2) {
        __m256 a = _mm256_maskload_ps(p, t->a);
        __m256 b = _mm256_maskload_ps(p + 7, t->b);
        __m256 v = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 2, 0));
        v = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(v), _MM_SHUFFLE(3, 1, 2, 0)));
        return _mm256_blendv_ps(ninf, v, _mm256_castsi256_ps(t->ok));
    }
    return _mm256_mask_i32gather_ps(ninf, p, offs, _mm256_castsi256_ps(t->ok), 4);
}

/* The masks of taps kx < kw of the group whose first window starts at column c, in
 * t[kx], computed once per group rather than once per tap (windows of up to
 * HOIST_KW columns; wider ones compute them per tap). */
#define HOIST_KW 8
ALWAYS_INLINE void group_masks(const mdl_pool_geom *g, int64_t c, __m256i offs, tap_masks *t)
{
    const __m256i wv = _mm256_set1_epi32((int)g->w);
    for (int64_t kx = 0; kx < g->kw && kx < HOIST_KW; kx++) t[kx] = tap_masks_at(c + kx, offs, wv);
}

ALWAYS_INLINE tap_masks group_mask(const mdl_pool_geom *g, int64_t c, int64_t kx, __m256i offs,
                                   const tap_masks *t)
{
    return kx < HOIST_KW ? t[kx] : tap_masks_at(c + kx, offs, _mm256_set1_epi32((int)g->w));
}

/* ---- max pooling ---------------------------------------------------------- */

/* The running maximum takes v where v > m or v is NaN. */
ALWAYS_INLINE __m256 max_take(__m256 v, __m256 m)
{
    return _mm256_or_ps(_mm256_cmp_ps(v, m, _CMP_GT_OQ), _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
}

/* The maximum of the windows of 8 output columns from o (row span [hs, he)). */
ALWAYS_INLINE __m256 max_vec(const mdl_pool_geom *g, const float *x, int64_t hs, int64_t he,
                             int64_t o, const int mode, __m256i offs)
{
    const float *base = x + o * g->sw - g->pw;
    __m256 m = _mm256_set1_ps(-INFINITY);
    for (int64_t ih = hs; ih < he; ih++)
        for (int64_t kx = 0; kx < g->kw; kx++) {
            __m256 v = load_strided(base + ih * g->w + kx, mode, offs);
            m = _mm256_blendv_ps(m, v, max_take(v, m));
        }
    return m;
}

/* Two groups of 8 columns, o1 and o2, at once: two independent dependency
 * chains (compare, blend) through the taps, which one group alone leaves
 * latency-bound. */
ALWAYS_INLINE void max_vec2(const mdl_pool_geom *g, const float *x, int64_t hs, int64_t he,
                            int64_t o1, int64_t o2, const int mode, __m256i offs, __m256 *r1,
                            __m256 *r2)
{
    const float *b1 = x + o1 * g->sw - g->pw, *b2 = x + o2 * g->sw - g->pw;
    __m256 m1 = _mm256_set1_ps(-INFINITY), m2 = m1;
    for (int64_t ih = hs; ih < he; ih++)
        for (int64_t kx = 0; kx < g->kw; kx++) {
            __m256 v1 = load_strided(b1 + ih * g->w + kx, mode, offs);
            __m256 v2 = load_strided(b2 + ih * g->w + kx, mode, offs);
            m1 = _mm256_blendv_ps(m1, v1, max_take(v1, m1));
            m2 = _mm256_blendv_ps(m2, v2, max_take(v2, m2));
        }
    *r1 = m1;
    *r2 = m2;
}

/* A group of 8 columns from o that reaches past a row end: out-of-row taps are
 * -inf, which never wins (every window has a tap in the row), so the taps in
 * the row are visited in the reference's order and the result is the same. */
ALWAYS_INLINE __m256 max_vec_masked(const mdl_pool_geom *g, const float *x, int64_t hs,
                                    int64_t he, int64_t o, const int mode, __m256i offs)
{
    const int64_t c = o * g->sw - g->pw;
    tap_masks t[HOIST_KW];
    group_masks(g, c, offs, t);
    __m256 m = _mm256_set1_ps(-INFINITY);
    for (int64_t ih = hs; ih < he; ih++)
        for (int64_t kx = 0; kx < g->kw; kx++) {
            const tap_masks tk = group_mask(g, c, kx, offs, t);
            __m256 v = load_strided_masked(x + ih * g->w + c + kx, mode, offs, &tk);
            m = _mm256_blendv_ps(m, v, max_take(v, m));
        }
    return m;
}

static inline int interior(const mdl_pool_geom *g, int64_t o)
{
    return o >= g->ow_lo && o + 8 <= g->ow_hi;
}

ALWAYS_INLINE void max_plane(const mdl_pool_geom *g, const float *x, float *y, const int mode)
{
    const __m256i offs = lane_offsets(g->sw);
    const int64_t wo = g->wo;
    for (int64_t oh = 0; oh < g->ho; oh++) {
        int64_t hs, he, span;
        mdl_pool_span(oh, g->sh, g->ph, g->kh, g->h, &hs, &he, &span);
        float *yrow = y + oh * wo;
        if (wo < 8) {
            mdl_max_pool_cols_scalar(g, x, y, oh, 0, wo);
            continue;
        }
        /* groups of 8 columns over [0, wo), the last one overlapping (same values) */
        int64_t ow = 0;
        while (ow < wo) {
            const int64_t o1 = ow + 8 <= wo ? ow : wo - 8;
            ow = o1 + 8;
            if (!interior(g, o1)) {
                _mm256_storeu_ps(yrow + o1, max_vec_masked(g, x, hs, he, o1, mode, offs));
                continue;
            }
            const int64_t o2 = ow + 8 <= wo ? ow : wo - 8;
            if (ow < wo && interior(g, o2)) {
                __m256 m1, m2;
                max_vec2(g, x, hs, he, o1, o2, mode, offs, &m1, &m2);
                _mm256_storeu_ps(yrow + o1, m1);
                _mm256_storeu_ps(yrow + o2, m2);
                ow = o2 + 8;
            } else {
                _mm256_storeu_ps(yrow + o1, max_vec(g, x, hs, he, o1, mode, offs));
            }
        }
    }
}

/* ---- 2x2 windows that tile a plane ------------------------------------------------ */

/* A plane tiled by 2x2 windows with stride 2 (no padding, no partial window) with 1, 2
 * or 4 outputs per row: any 8 consecutive outputs from a multiple of 8 read the 32
 * consecutive floats from 4 times that, which lane shuffles split into the windows'
 * four positions (tiled2_positions); the narrow rows otherwise take the scalar loop.
 * With a multiple of 8 outputs per row, 8 outputs of a row read 16 floats of each of
 * their two input rows (tiled2_row_positions), and the backward writes each element of
 * dx once, without the general kernel's clearing and scattering (bench/NOTES.md). */
static int tiled2(const mdl_pool_geom *g)
{
    return g->kh == 2 && g->kw == 2 && g->sh == 2 && g->sw == 2 && g->ph == 0 && g->pw == 0 &&
           g->h == 2 * g->ho && g->w == 2 * g->wo &&
           (g->wo == 1 || g->wo == 2 || g->wo == 4 || g->wo % 8 == 0);
}

/* the 64-bit halves: A0 A2 B0 B2 and A1 A3 B1 B3 */
ALWAYS_INLINE __m256 even64(__m256 a, __m256 b)
{
    const __m256d t = _mm256_unpacklo_pd(_mm256_castps_pd(a), _mm256_castps_pd(b));
    return _mm256_castpd_ps(_mm256_permute4x64_pd(t, _MM_SHUFFLE(3, 1, 2, 0)));
}
ALWAYS_INLINE __m256 odd64(__m256 a, __m256 b)
{
    const __m256d t = _mm256_unpackhi_pd(_mm256_castps_pd(a), _mm256_castps_pd(b));
    return _mm256_castpd_ps(_mm256_permute4x64_pd(t, _MM_SHUFFLE(3, 1, 2, 0)));
}
/* the inverses: (x, y) with mdl_even_lanes(x, y) == a, mdl_odd_lanes(x, y) == b (EL
 * 32-bit lanes), or even64 and odd64 (64-bit) */
ALWAYS_INLINE void interleave(const int EL, __m256 a, __m256 b, __m256 *x, __m256 *y)
{
    __m256 lo, hi;
    if (EL == 32) {
        lo = _mm256_unpacklo_ps(a, b);
        hi = _mm256_unpackhi_ps(a, b);
    } else {
        lo = _mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(a), _mm256_castps_pd(b)));
        hi = _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(a), _mm256_castps_pd(b)));
    }
    *x = _mm256_permute2f128_ps(lo, hi, 0x20);
    *y = _mm256_permute2f128_ps(lo, hi, 0x31);
}

/* q[k]: position k (row-major in the window) of 8 outputs' windows, from the 32 floats
 * at p (wo 4: two row pairs; 2: four; 1: eight) */
ALWAYS_INLINE void tiled2_positions(const float *p, int64_t wo, __m256 q[4])
{
    const __m256 a0 = _mm256_loadu_ps(p), a1 = _mm256_loadu_ps(p + 8);
    const __m256 a2 = _mm256_loadu_ps(p + 16), a3 = _mm256_loadu_ps(p + 24);
    if (wo == 4) {
        q[0] = mdl_even_lanes(a0, a2), q[1] = mdl_odd_lanes(a0, a2);
        q[2] = mdl_even_lanes(a1, a3), q[3] = mdl_odd_lanes(a1, a3);
        return;
    }
    const __m256 e = mdl_even_lanes(a0, a1), e2 = mdl_even_lanes(a2, a3);
    const __m256 o = mdl_odd_lanes(a0, a1), o2 = mdl_odd_lanes(a2, a3);
    if (wo == 2) {
        q[0] = even64(e, e2), q[1] = even64(o, o2), q[2] = odd64(e, e2), q[3] = odd64(o, o2);
    } else {
        q[0] = mdl_even_lanes(e, e2), q[1] = mdl_even_lanes(o, o2);
        q[2] = mdl_odd_lanes(e, e2), q[3] = mdl_odd_lanes(o, o2);
    }
}

/* the inverse: the 32 floats at p from the positions q */
ALWAYS_INLINE void tiled2_store(float *p, int64_t wo, const __m256 q[4])
{
    __m256 a0, a1, a2, a3;
    if (wo == 4) {
        interleave(32, q[0], q[1], &a0, &a2);
        interleave(32, q[2], q[3], &a1, &a3);
    } else {
        __m256 e, e2, o, o2;
        interleave(wo == 2 ? 64 : 32, q[0], q[2], &e, &e2);
        interleave(wo == 2 ? 64 : 32, q[1], q[3], &o, &o2);
        interleave(32, e, o, &a0, &a1);
        interleave(32, e2, o2, &a2, &a3);
    }
    _mm256_storeu_ps(p, a0);
    _mm256_storeu_ps(p + 8, a1);
    _mm256_storeu_ps(p + 16, a2);
    _mm256_storeu_ps(p + 24, a3);
}

/* q[k]: position k of the windows of 8 outputs of a row, whose first input row starts
 * at p (the second w floats on) */
ALWAYS_INLINE void tiled2_row_positions(const float *p, int64_t w, __m256 q[4])
{
    for (int r = 0; r < 2; r++) {
        const __m256 a = _mm256_loadu_ps(p + r * w), b = _mm256_loadu_ps(p + r * w + 8);
        q[2 * r] = mdl_even_lanes(a, b), q[2 * r + 1] = mdl_odd_lanes(a, b);
    }
}

/* the inverse: the two rows of 16 floats at p from the positions q */
ALWAYS_INLINE void tiled2_row_store(float *p, int64_t w, const __m256 q[4])
{
    for (int r = 0; r < 2; r++) {
        __m256 a, b;
        interleave(32, q[2 * r], q[2 * r + 1], &a, &b);
        _mm256_storeu_ps(p + r * w, a);
        _mm256_storeu_ps(p + r * w + 8, b);
    }
}

/* The maxima of 8 windows in the reference's order and rule, and which position won */
ALWAYS_INLINE __m256 tiled2_max(const __m256 q[4], __m256i *won)
{
    __m256 m = q[0];
    __m256i at = _mm256_setzero_si256();
    for (int k = 1; k < 4; k++) {
        const __m256 take = max_take(q[k], m);
        m = _mm256_blendv_ps(m, q[k], take);
        at = _mm256_blendv_epi8(at, _mm256_set1_epi32(k), _mm256_castps_si256(take));
    }
    *won = at;
    return m;
}

/* Forward (dy NULL: y = the maxima, and with tap each winner's position) or backward
 * (dx = dy at each maximum, 0 elsewhere) of a tiled2 plane; the last outputs past a
 * multiple of 8 by the scalar loop, whole rows (8 is a multiple of wo; with tap there
 * are none) */
static void tiled2_plane(const mdl_pool_geom *g, const float *x, const float *dy, float *out,
                         uint8_t *tap)
{
    const int64_t wo = g->wo, n = g->ho * wo, whole = n / 8 * 8;
    const int rows = wo % 8 == 0; /* 8 outputs of one row at a time */
    for (int64_t t = 0; t < whole; t += 8) {
        __m256 q[4];
        __m256i won;
        /* the first input of output t's window */
        const int64_t in = rows ? 2 * (t / wo) * g->w + 2 * (t % wo) : 4 * t;
        if (rows) tiled2_row_positions(x + in, g->w, q);
        else tiled2_positions(x + in, wo, q);
        const __m256 m = tiled2_max(q, &won);
        if (!dy) {
            _mm256_storeu_ps(out + t, m);
            if (tap) {
                int32_t at[8];
                _mm256_storeu_si256((__m256i *)at, won);
                for (int j = 0; j < 8; j++) tap[t + j] = (uint8_t)at[j];
            }
            continue;
        }
        const __m256 d = _mm256_loadu_ps(dy + t);
        for (int k = 0; k < 4; k++) /* 0 + dy as the reference's accumulation (-0 -> +0) */
            q[k] = _mm256_add_ps(_mm256_setzero_ps(),
                                 _mm256_and_ps(d, _mm256_castsi256_ps(_mm256_cmpeq_epi32(
                                                      won, _mm256_set1_epi32(k)))));
        if (rows) tiled2_row_store(out + in, g->w, q);
        else tiled2_store(out + in, wo, q);
    }
    if (dy) memset(out + 4 * whole, 0, (size_t)(4 * (n - whole)) * sizeof(float));
    for (int64_t oh = whole / wo; oh < g->ho; oh++) {
        if (dy) mdl_max_pool_back_cols_scalar(g, x, dy, out, oh, 0, wo);
        else mdl_max_pool_cols_scalar(g, x, out, oh, 0, wo);
    }
}

void mdl_max_pool_plane_avx2(const mdl_pool_geom *g, const float *x, float *y)
{
    if (tiled2(g)) {
        tiled2_plane(g, x, NULL, y, NULL);
        return;
    }
    switch (load_mode(g->sw)) {
    case LOAD_S1: max_plane(g, x, y, LOAD_S1); break;
    case LOAD_S2: max_plane(g, x, y, LOAD_S2); break;
    default: max_plane(g, x, y, LOAD_GATHER); break;
    }
}

/* The maxima of the windows of 8 output columns from o and where they are: best
 * takes, lane by lane, the index vector given with the window position that wins
 * (greater or NaN, as the reference); the caller sets best's start, the index of
 * each window's first position inside the plane. */
typedef struct arg_group {
    const float *base; /* x at the group's first window column */
    int64_t c;         /* that column */
    __m256i col;       /* each lane's first window column */
    int inside;
    __m256 m;
    __m256i best;
} arg_group;

/* t: the group's border masks (group_masks), filled when it is not interior; an array
 * of the caller's, so that the group's vectors can stay in registers */
ALWAYS_INLINE void arg_group_start(const mdl_pool_geom *g, const float *x, int64_t o,
                                   __m256i offs, arg_group *q, tap_masks *t)
{
    q->c = o * g->sw - g->pw;
    q->base = x + q->c;
    q->col = _mm256_add_epi32(_mm256_set1_epi32((int)q->c), offs);
    q->inside = interior(g, o);
    if (!q->inside) group_masks(g, q->c, offs, t);
    q->m = _mm256_set1_ps(-INFINITY);
}

/* window position (ih, kx), whose index in each lane is `index` */
ALWAYS_INLINE void arg_group_take(const mdl_pool_geom *g, int64_t ih, int64_t kx, __m256i index,
                                  const int mode, __m256i offs, arg_group *q,
                                  const tap_masks *t)
{
    const float *p = q->base + ih * g->w + kx;
    __m256 v;
    if (q->inside) {
        v = load_strided(p, mode, offs);
    } else {
        const tap_masks tk = group_mask(g, q->c, kx, offs, t);
        v = load_strided_masked(p, mode, offs, &tk);
    }
    const __m256 take = max_take(v, q->m);
    q->m = _mm256_blendv_ps(q->m, v, take);
    q->best = _mm256_blendv_epi8(q->best, index, _mm256_castps_si256(take));
}

/* The argmax of 8 windows is tracked as a vector of flat plane indices
 * (int32: vec_ok guarantees h * w < 2^31); dy is then scattered lane by lane,
 * in the reference's order. */
ALWAYS_INLINE void max_back_plane(const mdl_pool_geom *g, const float *x, const float *dy,
                                  float *dx, const int mode)
{
    const __m256i offs = lane_offsets(g->sw);
    const int64_t wo = g->wo;
    memset(dx, 0, (size_t)(g->h * g->w) * sizeof(float));
    for (int64_t oh = 0; oh < g->ho; oh++) {
        int64_t hs, he, span;
        mdl_pool_span(oh, g->sh, g->ph, g->kh, g->h, &hs, &he, &span);
        const float *dyrow = dy + oh * wo;
        if (wo < 8) {
            mdl_max_pool_back_cols_scalar(g, x, dy, dx, oh, 0, wo);
            continue;
        }
        int64_t ow = 0;
        while (ow < wo) {
            const int64_t o = ow + 8 <= wo ? ow : wo - 8;
            arg_group q;
            tap_masks t[HOIST_KW];
            arg_group_start(g, x, o, offs, &q, t);
            /* before any position is taken: the window's first in the row */
            q.best = _mm256_add_epi32(_mm256_max_epi32(q.col, _mm256_setzero_si256()),
                                      _mm256_set1_epi32((int)(hs * g->w)));
            for (int64_t ih = hs; ih < he; ih++) {
                __m256i cur = _mm256_add_epi32(q.col, _mm256_set1_epi32((int)(ih * g->w)));
                for (int64_t kx = 0; kx < g->kw; kx++) {
                    arg_group_take(g, ih, kx, cur, mode, offs, &q, t);
                    cur = _mm256_add_epi32(cur, _mm256_set1_epi32(1));
                }
            }
            int32_t at[8];
            _mm256_storeu_si256((__m256i *)at, q.best);
            for (int j = (int)(ow - o); j < 8; j++) dx[at[j]] += dyrow[o + j]; /* new lanes only */
            ow = o + 8;
        }
    }
}

void mdl_max_pool_back_plane_avx2(const mdl_pool_geom *g, const float *x, const float *dy,
                                  float *dx)
{
    if (tiled2(g)) {
        tiled2_plane(g, x, dy, dx, NULL);
        return;
    }
    switch (load_mode(g->sw)) {
    case LOAD_S1: max_back_plane(g, x, dy, dx, LOAD_S1); break;
    case LOAD_S2: max_back_plane(g, x, dy, dx, LOAD_S2); break;
    default: max_back_plane(g, x, dy, dx, LOAD_GATHER); break;
    }
}

ALWAYS_INLINE void arg_group_store(const arg_group *q, float *y, uint8_t *tap)
{
    _mm256_storeu_ps(y, q->m);
    /* 8 int32 taps < 256 to 8 bytes */
    const __m128i w16 = _mm_packus_epi32(_mm256_castsi256_si128(q->best),
                                         _mm256_extracti128_si256(q->best, 1));
    _mm_storel_epi64((__m128i *)tap, _mm_packus_epi16(w16, w16));
}

/* Max pooling that also records each maximum's tap: groups of 8 columns two at a time
 * (two independent chains, as max_vec2), the last group overlapping the one before. */
ALWAYS_INLINE void max_tap_plane(const mdl_pool_geom *g, const float *x, float *y, uint8_t *tap,
                                 const int mode)
{
    const __m256i offs = lane_offsets(g->sw);
    const int64_t wo = g->wo;
    for (int64_t oh = 0; oh < g->ho; oh++) {
        if (wo < 8) {
            mdl_max_pool_tap_cols_scalar(g, x, y, tap + oh * wo, oh, 0, wo);
            continue;
        }
        int64_t hs, he, span;
        mdl_pool_span(oh, g->sh, g->ph, g->kh, g->h, &hs, &he, &span);
        const int64_t r0 = oh * g->sh - g->ph;
        for (int64_t ow = 0; ow < wo;) {
            const int64_t o1 = ow + 8 <= wo ? ow : wo - 8;
            const int64_t o2 = o1 + 16 <= wo ? o1 + 8 : wo - 8;
            arg_group a, b;
            tap_masks ta[HOIST_KW], tb[HOIST_KW];
            arg_group_start(g, x, o1, offs, &a, ta);
            arg_group_start(g, x, o2, offs, &b, tb);
            /* before any position is taken: each window's first in the plane */
            const __m256i first = _mm256_set1_epi32((int)((hs - r0) * g->kw));
            const __m256i zero = _mm256_setzero_si256();
            a.best = _mm256_add_epi32(_mm256_max_epi32(_mm256_sub_epi32(zero, a.col), zero), first);
            b.best = _mm256_add_epi32(_mm256_max_epi32(_mm256_sub_epi32(zero, b.col), zero), first);
            for (int64_t ih = hs; ih < he; ih++)
                for (int64_t kx = 0; kx < g->kw; kx++) {
                    const __m256i t = _mm256_set1_epi32((int)((ih - r0) * g->kw + kx));
                    arg_group_take(g, ih, kx, t, mode, offs, &a, ta);
                    arg_group_take(g, ih, kx, t, mode, offs, &b, tb);
                }
            arg_group_store(&a, y + oh * wo + o1, tap + oh * wo + o1);
            arg_group_store(&b, y + oh * wo + o2, tap + oh * wo + o2);
            ow = o2 + 8;
        }
    }
}

void mdl_max_pool_tap_plane_avx2(const mdl_pool_geom *g, const float *x, float *y, uint8_t *tap)
{
    if (tiled2(g) && g->ho * g->wo % 8 == 0) {
        tiled2_plane(g, x, NULL, y, tap);
        return;
    }
    switch (load_mode(g->sw)) {
    case LOAD_S1: max_tap_plane(g, x, y, tap, LOAD_S1); break;
    case LOAD_S2: max_tap_plane(g, x, y, tap, LOAD_S2); break;
    default: max_tap_plane(g, x, y, tap, LOAD_GATHER); break;
    }
}

/* The backward from the taps of 3x3 windows at stride 2 without padding (cifar10_quick's
 * and AlexNet's max pools), without the scatter.  Output row oh, 8 windows j at a time:
 * input column 2j takes column 2 of window j - 1 and column 0 of window j, column 2j + 1
 * column 1 of window j, so window row kr's part of the even columns is dy rotated up a
 * lane (window j - 1 in lane j) where the tap is 3 kr + 2, plus dy where it is 3 kr, and
 * of the odd ones dy where it is 3 kr + 1.  Window row 0 completes input row 2 oh (after
 * row 2 of oh - 1), row 1 is input row 2 oh + 1, row 2 waits for oh + 1: the sums in the
 * reference's order of windows (oh, then ow), even and odd columns interleaved into 16
 * columns of dx, each stored once.  Lanes past the row's wo windows load dy as 0, so their
 * taps do not matter.  Returns 1 for a tap of 9 or more or one outside the input (the
 * reference's check), 0 otherwise. */
#define K3S2_GROUPS 32 /* groups of 8 even columns in a row: w up to 512 */

int mdl_max_pool_back_taps_k3s2_applies(const mdl_pool_geom *g)
{
    return g->kh == 3 && g->kw == 3 && g->sh == 2 && g->sw == 2 && g->ph == 0 &&
           g->pw == 0 && g->w >= 2 * g->wo - 1 && (g->w + 1) / 2 <= 8 * K3S2_GROUPS;
}

/* the taps of 8 windows as int32 lanes; `avail` taps readable (lanes past them 0) */
static inline __m256i k3s2_taps(const uint8_t *t, int64_t avail)
{
    if (avail >= 8) return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)t));
    uint64_t v = 0;
    for (int64_t i = 0; i < avail; i++) v |= (uint64_t)t[i] << (8 * i);
    return _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)v));
}

/* d where the tap t is `tap`, else 0 */
static inline __m256 k3s2_where(__m256 d, __m256i t, int tap)
{
    return _mm256_and_ps(d, _mm256_castsi256_ps(_mm256_cmpeq_epi32(t, _mm256_set1_epi32(tap))));
}

/* the 16 columns of dx at c0 from the even and odd sums, the first w - c0 of them */
static inline void k3s2_store(float *row, int64_t c0, int64_t w, __m256 even, __m256 odd)
{
    __m256 a, b;
    interleave(32, even, odd, &a, &b);
    if (c0 + 16 <= w) {
        _mm256_storeu_ps(row + c0, a);
        _mm256_storeu_ps(row + c0 + 8, b);
    } else {
        mdl_store_first8(row + c0, a, w - c0);
        if (c0 + 8 < w) mdl_store_first8(row + c0 + 8, b, w - c0 - 8);
    }
}

int mdl_max_pool_back_taps_k3s2_avx2(const mdl_pool_geom *g, const uint8_t *tap, const float *dy,
                                     float *dx)
{
    const int64_t h = g->h, w = g->w, ho = g->ho, wo = g->wo, ohw = ho * wo, ne = (w + 1) / 2;
    /* the reference's check: taps below 9, and inside the input at the last row and
     * column; MDL_POOL_NO_TAP matches no tap below and adds nothing */
    const __m128i none = _mm_set1_epi8((char)MDL_POOL_NO_TAP);
    __m128i most = _mm_set1_epi8(8); /* the largest tap other than none, at least 8 */
    int64_t k = 0;
    for (; k + 16 <= ohw; k += 16) {
        const __m128i t = _mm_loadu_si128((const __m128i *)(tap + k));
        most = _mm_max_epu8(most, _mm_andnot_si128(_mm_cmpeq_epi8(t, none), t));
    }
    if (_mm_movemask_epi8(_mm_cmpeq_epi8(most, _mm_set1_epi8(8))) != 0xFFFF) return 1;
    for (; k < ohw; k++)
        if (tap[k] >= 9 && tap[k] != MDL_POOL_NO_TAP) return 1;
    const int64_t last_rows = h - 2 * (ho - 1), last_cols = w - 2 * (wo - 1);
    for (int64_t ow = 0; last_rows < 3 && ow < wo; ow++) {
        const int t = tap[(ho - 1) * wo + ow];
        if (t != MDL_POOL_NO_TAP && t / 3 >= last_rows) return 1;
    }
    for (int64_t oh = 0; last_cols < 3 && oh < ho; oh++) {
        const int t = tap[oh * wo + wo - 1];
        if (t != MDL_POOL_NO_TAP && t % 3 >= last_cols) return 1;
    }
    /* output row oh gives rows 2 oh (its first window row, after the third of oh - 1, kept
     * in pend), 2 oh + 1 and, through pend, 2 oh + 2; the rows past them are zero */
    __m256 pend[K3S2_GROUPS][2];
    const __m256i up = _mm256_setr_epi32(7, 0, 1, 2, 3, 4, 5, 6); /* lane j: lane j - 1 */
    for (int64_t oh = 0; oh < ho; oh++) {
        __m256 dp = _mm256_setzero_ps();
        __m256i tp = _mm256_setzero_si256();
        for (int64_t j0 = 0, gi = 0; j0 < ne; j0 += 8, gi++) {
            const int64_t q = oh * wo + j0;
            const __m256 d = j0 + 8 <= wo ? _mm256_loadu_ps(dy + q)
                                          : _mm256_maskload_ps(dy + q, first_lanes(wo - j0));
            const __m256i t = k3s2_taps(tap + q, ohw - q);
            /* window j - 1 in lane j, lane 0 from the group before */
            const __m256 d1 = _mm256_blend_ps(_mm256_permutevar8x32_ps(d, up),
                                              _mm256_permutevar8x32_ps(dp, up), 1);
            const __m256i t1 = _mm256_blend_epi32(_mm256_permutevar8x32_epi32(t, up),
                                                  _mm256_permutevar8x32_epi32(tp, up), 1);
            dp = d;
            tp = t;
            __m256 e[3], o[3]; /* window row kr's even and odd columns, added in order */
            for (int kr = 0; kr < 3; kr++) {
                __m256 ev = kr == 0 && oh > 0 ? pend[gi][0] : _mm256_setzero_ps();
                __m256 od = kr == 0 && oh > 0 ? pend[gi][1] : _mm256_setzero_ps();
                ev = _mm256_add_ps(ev, k3s2_where(d1, t1, 3 * kr + 2));
                ev = _mm256_add_ps(ev, k3s2_where(d, t, 3 * kr));
                od = _mm256_add_ps(od, k3s2_where(d, t, 3 * kr + 1));
                e[kr] = ev;
                o[kr] = od;
            }
            k3s2_store(dx + 2 * oh * w, 2 * j0, w, e[0], o[0]);
            if (2 * oh + 1 < h) k3s2_store(dx + (2 * oh + 1) * w, 2 * j0, w, e[1], o[1]);
            pend[gi][0] = e[2];
            pend[gi][1] = o[2];
        }
    }
    if (2 * ho < h)
        for (int64_t j0 = 0, gi = 0; j0 < ne; j0 += 8, gi++)
            k3s2_store(dx + 2 * ho * w, 2 * j0, w, pend[gi][0], pend[gi][1]);
    for (int64_t r = 2 * ho + 1; r < h; r++) memset(dx + r * w, 0, (size_t)w * sizeof(float));
    return 0;
}

/* ---- average pooling ------------------------------------------------------ */

/* Interior windows span kw columns, so the divisor is one number per output row. */
ALWAYS_INLINE void avg_plane(const mdl_pool_geom *g, const float *x, float *y, const int mode)
{
    const __m256i offs = lane_offsets(g->sw);
    for (int64_t oh = 0; oh < g->ho; oh++) {
        int64_t hs, he, hspan;
        mdl_pool_span(oh, g->sh, g->ph, g->kh, g->h, &hs, &he, &hspan);
        const __m256 div = _mm256_set1_ps((float)(hspan * g->kw));
        mdl_avg_pool_cols_scalar(g, x, y, oh, 0, g->ow_lo);
        int64_t ow = g->ow_lo;
        for (; ow + 8 <= g->ow_hi; ow += 8) {
            const float *base = x + ow * g->sw - g->pw;
            __m256 sum = _mm256_setzero_ps();
            for (int64_t ih = hs; ih < he; ih++)
                for (int64_t kx = 0; kx < g->kw; kx++)
                    sum = _mm256_add_ps(sum, load_strided(base + ih * g->w + kx, mode, offs));
            _mm256_storeu_ps(y + oh * g->wo + ow, _mm256_div_ps(sum, div));
        }
        mdl_avg_pool_cols_scalar(g, x, y, oh, ow, g->wo);
    }
}

#define AVG_CHUNK 1024
#define AVG_MAX_KW 64

/* For strides >= 3 gathers cost more than they save; the window sum is
 * separable instead: sums over the window's rows first, 8 columns at a time,
 * into v (a chunk of columns on the stack), then each window adds its kw
 * column sums. */
static void avg_plane_separable(const mdl_pool_geom *g, const float *x, float *y)
{
    float v[AVG_CHUNK];
    const int64_t w = g->w, kw = g->kw, sw = g->sw;
    const int64_t per = (AVG_CHUNK - kw) / sw + 1; /* output columns per chunk */
    for (int64_t oh = 0; oh < g->ho; oh++) {
        int64_t hs, he, hspan, ws, we, wspan;
        mdl_pool_span(oh, g->sh, g->ph, g->kh, g->h, &hs, &he, &hspan);
        for (int64_t o0 = 0; o0 < g->wo; o0 += per) {
            const int64_t o1 = o0 + per < g->wo ? o0 + per : g->wo;
            int64_t a, b;
            mdl_pool_span(o0, sw, g->pw, kw, w, &a, &we, &wspan);
            mdl_pool_span(o1 - 1, sw, g->pw, kw, w, &ws, &b, &wspan);
            const int64_t len = b - a; /* <= (per - 1) * sw + kw <= AVG_CHUNK */
            int64_t i = 0;
            for (; i + 8 <= len; i += 8) {
                const float *col = x + hs * w + a + i;
                __m256 acc = _mm256_loadu_ps(col);
                for (int64_t ih = hs + 1; ih < he; ih++)
                    acc = _mm256_add_ps(acc, _mm256_loadu_ps(col += w));
                _mm256_storeu_ps(v + i, acc);
            }
            for (; i < len; i++) {
                float acc = 0.0f;
                for (int64_t ih = hs; ih < he; ih++) acc += x[ih * w + a + i];
                v[i] = acc;
            }
            float *yrow = y + oh * g->wo;
            for (int64_t ow = o0; ow < o1; ow++) {
                mdl_pool_span(ow, sw, g->pw, kw, w, &ws, &we, &wspan);
                float sum = 0.0f;
                for (int64_t iw = ws; iw < we; iw++) sum += v[iw - a];
                yrow[ow] = sum / (float)(hspan * wspan);
            }
        }
    }
}

/* Rows of up to AVG_ROW_MAX padded columns go through a row buffer: for each
 * output row, u[j] = sum over the window's rows of input column j - pw (zero in
 * the padding and beyond), 8 columns at a time with a masked tail; then each
 * group of 8 output columns adds its kw strided taps from u, with no border
 * cases: columns outside the input read zeros, and the divisor (padded window
 * height x width, clipped in ceil mode) comes from a per-column vector.  The
 * last group of a row is stored masked.  Any width, including rows whose
 * interior is under 8 columns (the 8x8 and 16x16 maps of small nets). */
#define AVG_ROW_MAX 1024

static int avg_rows_fit(const mdl_pool_geom *g)
{
    return g->wo + 8 <= AVG_ROW_MAX && (g->wo + 8) * g->sw + g->kw + 16 <= 2 * AVG_ROW_MAX &&
           g->pw + g->w <= 2 * AVG_ROW_MAX;
}

/* the row buffer of output row oh: the sums over its window's rows of each input column */
ALWAYS_INLINE void avg_column_sums(const mdl_pool_geom *g, const float *x, int64_t oh,
                                   __m256i wtail, float *urow)
{
    const int64_t w = g->w, wfull = w & ~(int64_t)7;
    int64_t hs, he, hspan;
    mdl_pool_span(oh, g->sh, g->ph, g->kh, g->h, &hs, &he, &hspan);
    int64_t j = 0;
    for (; j < wfull; j += 8) {
        const float *col = x + hs * w + j;
        __m256 acc = _mm256_loadu_ps(col);
        for (int64_t ih = hs + 1; ih < he; ih++) acc = _mm256_add_ps(acc, _mm256_loadu_ps(col += w));
        _mm256_storeu_ps(urow + j, acc);
    }
    if (j < w) {
        const float *col = x + hs * w + j;
        __m256 acc = _mm256_maskload_ps(col, wtail);
        for (int64_t ih = hs + 1; ih < he; ih++)
            acc = _mm256_add_ps(acc, _mm256_maskload_ps(col += w, wtail));
        mdl_store_first8(urow + j, acc, w - j);
    }
}

/* Row buffers in a ring of AVG_RING, filled AVG_RING - 1 output rows ahead of the row
 * whose taps read them: read right after their stores, the taps' unaligned loads,
 * which straddle two stores, waited for them to reach the cache (store forwarding
 * fails): most of the time on the small maps (bench/NOTES.md) */
#define AVG_RING 3

ALWAYS_INLINE void avg_plane_rows(const mdl_pool_geom *g, const float *x, float *y, const int mode)
{
    float u[AVG_RING][2 * AVG_ROW_MAX];
    const __m256i offs = lane_offsets(g->sw);
    const int64_t w = g->w, wo = g->wo, kw = g->kw, sw = g->sw;
    const int64_t len = (wo + 8) * sw + kw + 16 < 2 * AVG_ROW_MAX ? (wo + 8) * sw + kw + 16
                                                                  : 2 * AVG_ROW_MAX;
    for (int r = 0; r < AVG_RING && r < g->ho; r++) memset(u[r], 0, (size_t)len * sizeof(float));
    /* window widths (mdl_pool_span): min(kw, w + pw - start), start = ow sw - pw; lanes
     * past wo are not stored */
    const __m256 vkw = _mm256_set1_ps((float)kw);
    const __m256 lane_sw = _mm256_mul_ps(_mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7),
                                         _mm256_set1_ps((float)sw));
    const __m256i wtail = first_lanes(w - (w & ~(int64_t)7));
    for (int64_t oh = 0; oh < AVG_RING - 1 && oh < g->ho; oh++)
        avg_column_sums(g, x, oh, wtail, u[oh] + g->pw);
    for (int64_t oh = 0; oh < g->ho; oh++) {
        if (oh + AVG_RING - 1 < g->ho)
            avg_column_sums(g, x, oh + AVG_RING - 1, wtail, u[(oh + AVG_RING - 1) % AVG_RING] + g->pw);
        int64_t hs, he, hspan;
        mdl_pool_span(oh, g->sh, g->ph, g->kh, g->h, &hs, &he, &hspan);
        const __m256 vh = _mm256_set1_ps((float)hspan);
        float *yrow = y + oh * wo;
        for (int64_t o = 0; o < wo; o += 8) {
            const float *base = u[oh % AVG_RING] + o * sw; /* padded column of tap kx = 0 */
            __m256 sum = load_strided(base, mode, offs);
            for (int64_t kx = 1; kx < kw; kx++)
                sum = _mm256_add_ps(sum, load_strided(base + kx, mode, offs));
            const __m256 wspan = _mm256_min_ps(
                vkw, _mm256_sub_ps(_mm256_set1_ps((float)(w + 2 * g->pw - o * sw)), lane_sw));
            __m256 v = _mm256_div_ps(sum, _mm256_mul_ps(vh, wspan));
            if (o + 8 <= wo) _mm256_storeu_ps(yrow + o, v);
            else mdl_store_first8(yrow + o, v, wo - o);
        }
    }
}

void mdl_avg_pool_plane_avx2(const mdl_pool_geom *g, const float *x, float *y)
{
    if (avg_rows_fit(g)) {
        switch (load_mode(g->sw)) {
        case LOAD_S1: avg_plane_rows(g, x, y, LOAD_S1); return;
        case LOAD_S2: avg_plane_rows(g, x, y, LOAD_S2); return;
        default: avg_plane_rows(g, x, y, LOAD_GATHER); return;
        }
    }
    switch (load_mode(g->sw)) {
    case LOAD_S1: avg_plane(g, x, y, LOAD_S1); break;
    case LOAD_S2: avg_plane(g, x, y, LOAD_S2); break;
    default:
        if (g->kw <= AVG_MAX_KW) avg_plane_separable(g, x, y);
        else avg_plane(g, x, y, LOAD_GATHER);
        break;
    }
}

/* The backward is separable: window (oh, ow) covers rows [hs, he) x columns
 * [ws, we), so with g = dy / divisor, dx row ih = sum over the output rows oh
 * covering ih of t_oh, where t_oh[iw] = sum over the windows ow covering iw of
 * g[oh][ow].  t_oh is built in vector registers from u, the row of g spread
 * out at its windows' start columns (zeros between): t[iw] = sum over kx of
 * u[iw + pw - kx], kw shifted loads; then t is added to rows [hs, he) of dx.
 * Input columns go in chunks so that u and t fit on the stack; any stride. */
/* Small planes (ho * w up to AVG_T_MAX): the rows t_oh of the whole plane go
 * into a buffer first; then each dx row is the sum of the t rows of the output
 * rows covering it, stored once -- no memset of dx and no read-modify-write
 * of its rows.  The sums come in the same order (oh increasing). */
#define AVG_T_MAX 8192
#define AVG_T_ROWS 1024

static void avg_back_plane_rows(const mdl_pool_geom *g, const float *dy, float *dx)
{
    float u[AVG_CHUNK + AVG_MAX_KW], T[AVG_T_MAX];
    int64_t hs_of[AVG_T_ROWS], he_of[AVG_T_ROWS];
    const int64_t w = g->w, kw = g->kw, sw = g->sw, ho = g->ho;
    const int64_t jlo = g->pw - kw + 1, ulen = w + kw - 1;
    for (int64_t oh = 0; oh < ho; oh++) {
        int64_t hspan, ws, we, wspan;
        mdl_pool_span(oh, g->sh, g->ph, g->kh, g->h, &hs_of[oh], &he_of[oh], &hspan);
        const float *dyrow = dy + oh * g->wo;
        memset(u, 0, (size_t)ulen * sizeof(float));
        int64_t owa = jlo <= 0 ? 0 : (jlo + sw - 1) / sw;
        int64_t owb = (jlo + ulen - 1) / sw + 1;
        if (owb > g->wo) owb = g->wo;
        for (int64_t ow = owa; ow < owb; ow++) {
            mdl_pool_span(ow, sw, g->pw, kw, w, &ws, &we, &wspan);
            u[ow * sw - jlo] = dyrow[ow] / (float)(hspan * wspan);
        }
        float *t = T + oh * w;
        int64_t i = 0;
        for (; i + 8 <= w; i += 8) {
            __m256 acc = _mm256_loadu_ps(u + i + kw - 1);
            for (int64_t kx = 1; kx < kw; kx++)
                acc = _mm256_add_ps(acc, _mm256_loadu_ps(u + i + kw - 1 - kx));
            _mm256_storeu_ps(t + i, acc);
        }
        for (; i < w; i++) {
            float acc = u[i + kw - 1];
            for (int64_t kx = 1; kx < kw; kx++) acc += u[i + kw - 1 - kx];
            t[i] = acc;
        }
    }
    /* the output rows covering input row ih are a contiguous range [a, b) */
    int64_t a = 0, b = 0;
    for (int64_t ih = 0; ih < g->h; ih++) {
        while (a < ho && he_of[a] <= ih) a++;
        if (b < a) b = a;
        while (b < ho && hs_of[b] <= ih) b++;
        float *row = dx + ih * w;
        int64_t i = 0;
        for (; i + 8 <= w; i += 8) {
            __m256 acc = _mm256_setzero_ps();
            for (int64_t oh = a; oh < b; oh++) acc = _mm256_add_ps(acc, _mm256_loadu_ps(T + oh * w + i));
            _mm256_storeu_ps(row + i, acc);
        }
        for (; i < w; i++) {
            float acc = 0.0f;
            for (int64_t oh = a; oh < b; oh++) acc += T[oh * w + i];
            row[i] = acc;
        }
    }
}

static void avg_back_plane(const mdl_pool_geom *g, const float *dy, float *dx)
{
    if (g->kw <= AVG_MAX_KW && g->w + g->kw <= AVG_CHUNK && g->ho * g->w <= AVG_T_MAX &&
        g->ho <= AVG_T_ROWS) {
        avg_back_plane_rows(g, dy, dx);
        return;
    }
    if (g->kw > AVG_MAX_KW) {
        mdl_avg_pool_back_plane_scalar(g, dy, dx);
        return;
    }
    float u[AVG_CHUNK + AVG_MAX_KW], t[AVG_CHUNK];
    const int64_t w = g->w, kw = g->kw, sw = g->sw;
    memset(dx, 0, (size_t)(g->h * w) * sizeof(float));
    for (int64_t oh = 0; oh < g->ho; oh++) {
        int64_t hs, he, hspan, ws, we, wspan;
        mdl_pool_span(oh, g->sh, g->ph, g->kh, g->h, &hs, &he, &hspan);
        const float *dyrow = dy + oh * g->wo;
        for (int64_t c0 = 0; c0 < w; c0 += AVG_CHUNK) {
            const int64_t len = w - c0 < AVG_CHUNK ? w - c0 : AVG_CHUNK;
            /* u[i] is padded column jlo + i; padded column j is input column j - pw */
            const int64_t jlo = c0 + g->pw - kw + 1, ulen = len + kw - 1;
            memset(u, 0, (size_t)ulen * sizeof(float));
            int64_t owa = jlo <= 0 ? 0 : (jlo + sw - 1) / sw;
            int64_t owb = (jlo + ulen - 1) / sw + 1; /* jlo + ulen - 1 = c0 + len - 1 + pw >= 0 */
            if (owb > g->wo) owb = g->wo;
            for (int64_t ow = owa; ow < owb; ow++) {
                mdl_pool_span(ow, sw, g->pw, kw, w, &ws, &we, &wspan);
                u[ow * sw - jlo] = dyrow[ow] / (float)(hspan * wspan);
            }
            int64_t i = 0;
            for (; i + 8 <= len; i += 8) {
                __m256 acc = _mm256_loadu_ps(u + i + kw - 1);
                for (int64_t kx = 1; kx < kw; kx++)
                    acc = _mm256_add_ps(acc, _mm256_loadu_ps(u + i + kw - 1 - kx));
                _mm256_storeu_ps(t + i, acc);
            }
            for (; i < len; i++) {
                float acc = u[i + kw - 1];
                for (int64_t kx = 1; kx < kw; kx++) acc += u[i + kw - 1 - kx];
                t[i] = acc;
            }
            for (int64_t ih = hs; ih < he; ih++) {
                float *row = dx + ih * w + c0;
                for (i = 0; i + 8 <= len; i += 8)
                    _mm256_storeu_ps(row + i, _mm256_add_ps(_mm256_loadu_ps(row + i),
                                                            _mm256_loadu_ps(t + i)));
                for (; i < len; i++) row[i] += t[i];
            }
        }
    }
}

/* The backward of planes of at most 16 columns (cifar10_quick's 8x8 and 16x16 maps), a
 * run of planes at a time.  What depends only on the geometry is worked out once per
 * run: the divisors, each window's input columns as lane masks, the output rows over
 * each input row.  Then per plane: g = dy / divisor (vector divisions, as exact as the
 * scalar ones); t_oh = the sum over ow (decreasing, as avg_back_plane_rows adds them)
 * of g[oh][ow] masked to its window's columns; dx row ih = the sum of the t_oh covering
 * it (oh increasing), stored once.  The sums are avg_back_plane_rows', but for the sign
 * of zero sums. */
#define AVG_SMALL_W 16
#define AVG_SMALL_H 64

typedef struct {
    int64_t lo[AVG_SMALL_H], hi[AVG_SMALL_H]; /* input row ih's output rows [lo, hi) */
    float div[AVG_SMALL_H * AVG_SMALL_W];     /* (ho, wo) divisors */
    __m256 cols[AVG_SMALL_W][2];              /* lanes iw: the columns of window ow */
    __m256i tail;                             /* the lanes of w in the last vector */
} avg_back_geom;

static int avg_back_small_fits(const mdl_pool_geom *g)
{
    return g->w <= AVG_SMALL_W && g->wo <= AVG_SMALL_W && g->h <= AVG_SMALL_H &&
           g->ho <= AVG_SMALL_H;
}

static void avg_back_small_setup(const mdl_pool_geom *g, avg_back_geom *s)
{
    const int64_t w = g->w, ho = g->ho, wo = g->wo;
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    int64_t hs[AVG_SMALL_H], he[AVG_SMALL_H], wspan[AVG_SMALL_W];
    for (int64_t ow = 0; ow < wo; ow++) {
        int64_t ws, we;
        mdl_pool_span(ow, g->sw, g->pw, g->kw, w, &ws, &we, &wspan[ow]);
        for (int v = 0; v < 2; v++) { /* lanes in [ws, we) */
            const __m256i col = _mm256_add_epi32(lane, _mm256_set1_epi32(8 * v));
            s->cols[ow][v] = _mm256_castsi256_ps(
                _mm256_andnot_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)ws), col),
                                    _mm256_cmpgt_epi32(_mm256_set1_epi32((int)we), col)));
        }
    }
    for (int64_t oh = 0; oh < ho; oh++) {
        int64_t hspan;
        mdl_pool_span(oh, g->sh, g->ph, g->kh, g->h, &hs[oh], &he[oh], &hspan);
        for (int64_t ow = 0; ow < wo; ow++) s->div[oh * wo + ow] = (float)(hspan * wspan[ow]);
    }
    for (int64_t ih = 0, a = 0, b = 0; ih < g->h; ih++) {
        while (a < ho && he[a] <= ih) a++;
        if (b < a) b = a;
        while (b < ho && hs[b] <= ih) b++;
        s->lo[ih] = a;
        s->hi[ih] = b;
    }
    s->tail = first_lanes(w > 8 ? w - 8 : w);
}

/* nv: vectors to a row of w (1 or 2) */
ALWAYS_INLINE void avg_back_small(const mdl_pool_geom *g, const avg_back_geom *s,
                                  int64_t planes, const float *dy, float *dx, const int nv)
{
    const int64_t w = g->w, h = g->h, ho = g->ho, wo = g->wo, ohw = ho * wo;
    float q[AVG_SMALL_H * AVG_SMALL_W];
    __m256 t[AVG_SMALL_H][2];
    for (int64_t p = 0; p < planes; p++, dy += ohw, dx += h * w) {
        int64_t k = 0;
        for (; k + 8 <= ohw; k += 8)
            _mm256_storeu_ps(q + k, _mm256_div_ps(_mm256_loadu_ps(dy + k),
                                                  _mm256_loadu_ps(s->div + k)));
        for (; k < ohw; k++) q[k] = dy[k] / s->div[k];
        for (int64_t oh = 0; oh < ho; oh++) {
            __m256 t0 = _mm256_setzero_ps(), t1 = t0;
            for (int64_t ow = wo - 1; ow >= 0; ow--) {
                const __m256 gv = _mm256_broadcast_ss(q + oh * wo + ow);
                t0 = _mm256_add_ps(t0, _mm256_and_ps(gv, s->cols[ow][0]));
                if (nv == 2) t1 = _mm256_add_ps(t1, _mm256_and_ps(gv, s->cols[ow][1]));
            }
            t[oh][0] = t0;
            t[oh][1] = t1;
        }
        for (int64_t ih = 0; ih < h; ih++) {
            __m256 a0 = _mm256_setzero_ps(), a1 = a0;
            for (int64_t oh = s->lo[ih]; oh < s->hi[ih]; oh++) {
                a0 = _mm256_add_ps(a0, t[oh][0]);
                if (nv == 2) a1 = _mm256_add_ps(a1, t[oh][1]);
            }
            float *row = dx + ih * w;
            if (nv == 2) {
                _mm256_storeu_ps(row, a0);
                row += 8;
                a0 = a1;
            }
            if (w == 8 * nv) _mm256_storeu_ps(row, a0);
            else _mm256_maskstore_ps(row, s->tail, a0);
        }
    }
}

void mdl_avg_pool_back_planes_avx2(const mdl_pool_geom *g, int64_t planes, const float *dy,
                                   float *dx)
{
    if (!avg_back_small_fits(g)) {
        for (int64_t p = 0; p < planes; p++)
            avg_back_plane(g, dy + p * g->ho * g->wo, dx + p * g->h * g->w);
        return;
    }
    avg_back_geom s;
    avg_back_small_setup(g, &s);
    if (g->w > 8) avg_back_small(g, &s, planes, dy, dx, 2);
    else avg_back_small(g, &s, planes, dy, dx, 1);
}

/* ---- global average pooling ----------------------------------------------- */

/* mean of x[hw] */
float mdl_global_avg_avx2(int64_t hw, const float *x)
{
    return mdl_sum_ps(x, hw) / (float)hw;
}

/* dx[hw] = dy / hw */
void mdl_global_avg_back_avx2(int64_t hw, float dy, float *dx)
{
    const float v = dy / (float)hw;
    const __m256 vv = _mm256_set1_ps(v);
    int64_t i = 0;
    for (; i + 8 <= hw; i += 8) _mm256_storeu_ps(dx + i, vv);
    for (; i < hw; i++) dx[i] = v;
}
#endif
