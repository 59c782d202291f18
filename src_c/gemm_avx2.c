/* gemm_avx2.c -- blocked AVX2+FMA SGEMM (compiled with -mavx2 -mfma).
 *
 * C[m,n] = alpha * op(A) @ op(B) + beta * C, row-major (see gemm.h), through the
 * drivers of gemm_blocked.h.
 *
 * Packed A holds alpha * op(A) in micro-panels of MR = 6 rows, packed B op(B) in
 * micro-panels of NR = 16 columns; transposes are handled while packing.  The
 * micro-kernel keeps a 6x16 tile of C in 12 ymm accumulators and broadcasts each
 * element of A; tiles with fewer rows use the same kernel specialised for that
 * row count, tiles with fewer columns go through a small temporary, and B read in
 * place through lane masks.
 *
 * For the convolution, mdl_sgemm_avx2_pack_a / mdl_sgemm_avx2_packed multiply
 * weights packed once by an image's columns on one thread, and
 * mdl_sgemm_avx2_packed_image by rows of an image read in place, with an epilogue
 * (bias, ReLU, row sums). */
#include "common.h"
#if MDL_X86
#include <immintrin.h>
#include <string.h>
#include "gemm.h"
#include "simd_avx2.h"

#define MR 6
_Static_assert(MR == MDL_SGEMM_AVX2_MR, "gemm.h's MR");
#define SHORT_K 32
#define SHORT_MR MR /* a tile's 6 rows already fit L1's 8 ways (gemm_blocked.h's tile_rows) */
#define NR 16
#ifndef AVX2_KC /* -DAVX2_KC=N builds another K block, to measure it (bench/sgemm_c.c) */
#define AVX2_KC 320
#endif
#define KC_MAX AVX2_KC /* B micro-panel kc x 16 floats: <= 20 KiB, stays in L1 */
/* The shared-blocks driver: row groups of MC_PANELS A micro-panels (24 x 6 x 320
 * floats = 180 KiB, in L2); a B micro-panel (kc x 16 floats, 20 KiB, in L1) meets each
 * A micro-panel of the group in turn, and all of a thread's columns are one group
 * (the 6 x 16 tile loads more of B than of A per step; measured against column
 * groups of B in L2 with an A micro-panel in L1: 0.88-1.07x) */
#define MC_PANELS 24
#define B_PANEL_OUTER 1
#define NG (NC_MAX / NR)
/* B packed a group of LAZY_NG micro-panels (at most 160 KiB, in L2) at a time, just
 * before its tiles, only for C of one row group (at most 144 rows) and K over SHORT_K
 * (Zen 3, against packing all of a thread's columns first, the two builds in one
 * process: the products of the convolutions' forwards with 16-64 rows 1.05-1.09x on 2
 * threads, 1.04-1.15x on 1; larger ones take more than one row group, which would each
 * read all of A again) */
#define LAZY_B 0
#define LAZY_NG 8
#define MB_MAX 1536  /* rows of A packed per step */
#define NC_MAX 4096  /* columns of B packed per step */
/* rows or columns split when a K block of all of op(B) (kc x n) fits in half of a
 * 512 KiB L2; columns split for C of at most 3 micro-panels' rows, reading B in
 * place for at most 2 (16 x 1024 x 27 with B in place: 0.74x on 1 thread) */
#ifndef ROWS_SPLIT_BLOCK
#  define ROWS_SPLIT_BLOCK (64 * 1024)
#endif
#define ROWS_SPLIT_B_MAX (512 * 1024)
#define COLS_SPLIT_M (3 * MR)
#define COLS_SPLIT_IN_PLACE_M (2 * MR)
#define SHARED_IN_PLACE_M 0 /* B read in place with 6-row tiles: 64 x 1024 x 576 at 0.62x */
#define SHARED_IN_PLACE_UNALIGNED_M 0
#define B_ALIGN 8 /* floats in a ymm */

/* ---- packing ------------------------------------------------------------------ */


/* One A micro-panel: dst[p * MR + r] = alpha * op(A)[i0 + r][p0 + p] for
 * r < rows (zero for rows <= r < MR), p < kc. */
static void pack_a(int trans_a, const float *a, int64_t lda, int64_t i0, int64_t p0,
                   int rows, int64_t kc, float alpha, float *restrict dst)
{
    if (trans_a) { /* op(A)[i][p] = a[p * lda + i]: MR contiguous floats per p */
        for (int64_t p = 0; p < kc; p++) {
            const float *src = a + (p0 + p) * lda + i0;
            float *d = dst + p * MR;
            int r = 0;
            for (; r < rows; r++) d[r] = alpha * src[r];
            for (; r < MR; r++) d[r] = 0.0f;
        }
        return;
    }
    /* op(A)[i][p] = a[i * lda + p]: rows are contiguous in p; transpose 8 p at a time */
    const float *src[MR];
    for (int r = 0; r < MR; r++) src[r] = a + (i0 + (r < rows ? r : 0)) * lda + p0;
    const __m256 va = _mm256_set1_ps(alpha), zero = _mm256_setzero_ps();
    int64_t p = 0;
    for (; p + 8 <= kc; p += 8) {
        __m256 v[8];
        for (int r = 0; r < MR; r++)
            v[r] = r < rows ? _mm256_mul_ps(va, _mm256_loadu_ps(src[r] + p)) : zero;
        v[6] = v[7] = zero;
        mdl_transpose8_ps(v);
        float *d = dst + p * MR;
        /* each column is 6 floats: 8-wide stores overlap the next column, which
         * is written afterwards; the last one must not run past this panel */
        for (int q = 0; q < 7; q++) _mm256_storeu_ps(d + q * MR, v[q]);
        _mm_storeu_ps(d + 7 * MR, _mm256_castps256_ps128(v[7]));
        _mm_storel_pi((__m64 *)(d + 7 * MR + 4), _mm256_extractf128_ps(v[7], 1));
    }
    for (; p < kc; p++) {
        float *d = dst + p * MR;
        int r = 0;
        for (; r < rows; r++) d[r] = alpha * src[r][p];
        for (; r < MR; r++) d[r] = 0.0f;
    }
}

/* One B micro-panel: dst[p * NR + j] = op(B)[p0 + p][j0 + j] for j < cols
 * (zero for cols <= j < NR), p < kc. */
static void pack_b(int trans_b, const float *b, int64_t ldb, int64_t j0, int64_t p0,
                   int cols, int64_t kc, float *restrict dst)
{
    if (!trans_b) { /* op(B)[p][j] = b[p * ldb + j]: NR contiguous floats per p */
        const float *src = b + p0 * ldb + j0;
        if (cols == NR) {
            for (int64_t p = 0; p < kc; p++) {
                _mm256_store_ps(dst + p * NR, _mm256_loadu_ps(src + p * ldb));
                _mm256_store_ps(dst + p * NR + 8, _mm256_loadu_ps(src + p * ldb + 8));
            }
        } else {
            for (int64_t p = 0; p < kc; p++) {
                int j = 0;
                for (; j < cols; j++) dst[p * NR + j] = src[p * ldb + j];
                for (; j < NR; j++) dst[p * NR + j] = 0.0f;
            }
        }
        return;
    }
    /* op(B)[p][j] = b[j * ldb + p]: columns of op(B) are contiguous in p */
    const float *src[NR];
    for (int j = 0; j < NR; j++) src[j] = b + (j0 + (j < cols ? j : 0)) * ldb + p0;
    const __m256 zero = _mm256_setzero_ps();
    int64_t p = 0;
    for (; p + 8 <= kc; p += 8) {
        for (int h = 0; h < 2; h++) {
            __m256 v[8];
            for (int j = 0; j < 8; j++)
                v[j] = h * 8 + j < cols ? _mm256_loadu_ps(src[h * 8 + j] + p) : zero;
            mdl_transpose8_ps(v);
            for (int q = 0; q < 8; q++) _mm256_store_ps(dst + (p + q) * NR + h * 8, v[q]);
        }
    }
    for (; p < kc; p++) {
        int j = 0;
        for (; j < cols; j++) dst[p * NR + j] = src[j][p];
        for (; j < NR; j++) dst[p * NR + j] = 0.0f;
    }
}

/* ---- micro-kernel ------------------------------------------------------------- */

/* C tile (rows x cols, rows == ROWS <= MR, cols <= NR) = A micro-panel @ B + beta * C
 * (beta == 0: C is not read), then, when ep is not NULL, the epilogue on the final
 * values of rows row0.. (see mdl_epilogue).  A is packed (a micro-panel, element
 * (r, p) at a[p * MR + r]) or, with AIN, read in place (row r at a + r * lda_).
 * B is, by BMODE: */
enum {
    B_PACKED,   /* a packed micro-panel: row p at b + p * NR */
    B_IN_PLACE, /* row p at b + p * ldb, lanes past cols not read */
    B_IN_PLACE_NEXT, /* as B_IN_PLACE, whole, and the next micro-panel's row (bp + NR) is
                      * prefetched into L2 (kernel_next) */
    B_OFFSETS   /* row p: the 8 floats at b + off[p], then the 8 at b + off[p] + half */
};
/* The accumulators are named variables (not an array) so that they stay in
 * registers; rows >= ROWS fold away at compile time.  Tiles with fewer columns go
 * through a small temporary. */
#define ROW_FMA(r)                                                              \
    if (ROWS > r) {                                                             \
        __m256 av = _mm256_broadcast_ss(AIN ? a + r * lda_ + p : a + p * MR + r); \
        c##r##0 = _mm256_fmadd_ps(av, b0, c##r##0);                             \
        c##r##1 = _mm256_fmadd_ps(av, b1, c##r##1);                             \
    }
#define ROW_FINISH(r)                                                                   \
    if (ROWS > r) {                                                                     \
        float *cr = cp + r * ldp;                                                       \
        if (beta != 0.0f) {                                                             \
            c##r##0 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(cr), c##r##0);                \
            c##r##1 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(cr + 8), c##r##1);            \
        }                                                                               \
        if (ep) epilogue_row(ep, row0 + r, &c##r##0, &c##r##1, m0, m1, cols);           \
        _mm256_storeu_ps(cr, c##r##0);                                                  \
        _mm256_storeu_ps(cr + 8, c##r##1);                                              \
    }

/* One row of a tile, v0 | v1 (16 columns; m0 | m1 mark the valid ones, n of them): +
 * bias, max(0, .), then the row's sum and sum of squares added to the epilogue's sums. */
static inline __attribute__((always_inline)) void
epilogue_row(const mdl_epilogue *ep, int64_t row, __m256 *v0, __m256 *v1, __m256 m0, __m256 m1,
             int n)
{
    if (ep->bias) {
        const __m256 b = _mm256_set1_ps(ep->bias[row]);
        *v0 = _mm256_add_ps(*v0, b);
        *v1 = _mm256_add_ps(*v1, b);
    }
    if (ep->relu) {
        *v0 = _mm256_max_ps(_mm256_setzero_ps(), *v0); /* NaN passes: max_ps returns */
        *v1 = _mm256_max_ps(_mm256_setzero_ps(), *v1); /* its second operand then */
    }
    if (ep->row_sum) { /* shifted by the tile row's mean (mdl_add_shifted_sums) */
        const float mean = mdl_hsum_ps(_mm256_add_ps(_mm256_and_ps(*v0, m0),
                                                     _mm256_and_ps(*v1, m1))) / (float)n;
        const __m256 k = _mm256_set1_ps(mean);
        const __m256 d0 = _mm256_and_ps(_mm256_sub_ps(*v0, k), m0);
        const __m256 d1 = _mm256_and_ps(_mm256_sub_ps(*v1, k), m1);
        mdl_add_shifted_sums(mean, n, mdl_hsum_ps(_mm256_add_ps(d0, d1)),
                             mdl_hsum_ps(_mm256_fmadd_ps(d0, d0, _mm256_mul_ps(d1, d1))),
                             ep->row_sum + row, ep->row_sumsq + row);
    }
}

static inline __attribute__((always_inline)) void
kernel_rows(const int ROWS, const int AIN, const int BMODE, int64_t lda_, int64_t kc,
            const float *restrict a, const float *restrict b, int64_t ldb,
            const int64_t *restrict off, int64_t half, float *c, int64_t ldc, int cols,
            float beta, const mdl_epilogue *ep, int64_t row0)
{
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    const __m256i bm0 = mdl_lane_mask(0, cols), bm1 = mdl_lane_mask(0, cols - 8);
    const int whole = cols == NR;
    if (beta != 0.0f) /* C's rows, read after the loop: their misses overlap the FMAs */
        for (int r = 0; r < ROWS; r++) {
            _mm_prefetch((const char *)(c + r * ldc), _MM_HINT_T0);
            _mm_prefetch((const char *)(c + r * ldc + NR - 1), _MM_HINT_T0);
        }
#pragma GCC unroll 4
    for (int64_t p = 0; p < kc; p++) {
        __m256 b0, b1;
        if (BMODE == B_OFFSETS) {
            b0 = _mm256_loadu_ps(b + off[p]);
            b1 = _mm256_loadu_ps(b + off[p] + half);
        } else if (BMODE == B_IN_PLACE || BMODE == B_IN_PLACE_NEXT) {
            const float *bp = b + p * ldb;
            if (BMODE == B_IN_PLACE_NEXT) {
                _mm_prefetch((const char *)(bp + NR), _MM_HINT_T1);
                _mm_prefetch((const char *)(bp + 2 * NR - 1), _MM_HINT_T1);
            }
            b0 = whole ? _mm256_loadu_ps(bp) : _mm256_maskload_ps(bp, bm0);
            b1 = whole ? _mm256_loadu_ps(bp + 8) : _mm256_maskload_ps(bp + 8, bm1);
        } else {
            b0 = _mm256_load_ps(b + p * NR);
            b1 = _mm256_load_ps(b + p * NR + 8);
        }
        ROW_FMA(0) ROW_FMA(1) ROW_FMA(2) ROW_FMA(3) ROW_FMA(4) ROW_FMA(5)
    }
    const __m256 vb = _mm256_set1_ps(beta);
    float tmp[MR * NR];
    float *cp = c;
    int64_t ldp = ldc;
    __m256 m0 = _mm256_castsi256_ps(mdl_lane_mask(0, 8)), m1 = m0;
    if (!whole) {
        cp = tmp;
        ldp = NR;
        m0 = _mm256_castsi256_ps(bm0);
        m1 = _mm256_castsi256_ps(bm1);
        if (beta != 0.0f)
            for (int r = 0; r < ROWS; r++) memcpy(tmp + r * NR, c + r * ldc, (size_t)cols * 4);
    }
    ROW_FINISH(0) ROW_FINISH(1) ROW_FINISH(2) ROW_FINISH(3) ROW_FINISH(4) ROW_FINISH(5)
    if (!whole)
        for (int r = 0; r < ROWS; r++) memcpy(c + r * ldc, tmp + r * NR, (size_t)cols * 4);
}

/* The cases of a switch over a tile's rows, 1 to MR */
#define ROW_CASES(CASE) CASE(6) CASE(5) CASE(4) CASE(3) CASE(2) default: CASE(1)

/* A tile of `rows` rows: A packed (a_ld == 0) or in place (row stride a_ld); B packed
 * (b_ld == 0, off == NULL), in place (row stride b_ld) or rows at offsets (off); an
 * epilogue (ep) or none. */
static void tile(int rows, int64_t kc, const float *a, int64_t a_ld, const float *b, int64_t b_ld,
                 const int64_t *off, int64_t half, float *c, int64_t ldc, int cols, float beta,
                 const mdl_epilogue *ep, int64_t row0)
{
#define K(R, AIN, BMODE) kernel_rows(R, AIN, BMODE, a_ld, kc, a, b, b_ld, off, half, c, ldc, cols, \
                                     beta, ep, row0)
#define KERNEL_CASE(R)                                                  \
    case R:                                                            \
        if (off && a_ld) K(R, 1, B_OFFSETS);                           \
        else if (off) K(R, 0, B_OFFSETS);                              \
        else if (a_ld && b_ld) K(R, 1, B_IN_PLACE);                    \
        else if (a_ld) K(R, 1, B_PACKED);                              \
        else if (b_ld) K(R, 0, B_IN_PLACE);                            \
        else K(R, 0, B_PACKED);                                        \
        break;
    switch (rows) { ROW_CASES(KERNEL_CASE) }
#undef KERNEL_CASE
#undef K
}

/* The tile kernel of the drivers (gemm_blocked.h) */
static void kernel(int rows, int64_t kc, const float *a, int64_t a_ld, const float *b, int64_t b_ld,
                   float *c, int64_t ldc, int cols, float beta)
{
    tile(rows, kc, a, a_ld, b, b_ld, NULL, 0, c, ldc, cols, beta, NULL, 0);
}

/* A full-width tile with B in place that prefetches the next micro-panel (gemm_blocked.h) */
static void kernel_next(int rows, int64_t kc, const float *a, int64_t a_ld, const float *b,
                        int64_t b_ld, float *c, int64_t ldc, float beta)
{
#define K(R, AIN) kernel_rows(R, AIN, B_IN_PLACE_NEXT, a_ld, kc, a, b, b_ld, NULL, 0, c, ldc, NR, \
                              beta, NULL, 0)
#define NEXT_CASE(R)                                                    \
    case R:                                                            \
        if (a_ld) K(R, 1);                                             \
        else K(R, 0);                                                  \
        break;
    switch (rows) { ROW_CASES(NEXT_CASE) }
#undef NEXT_CASE
#undef K
}

/* np full-width tiles side by side, B micro-panel q at b + q * b_step (gemm_blocked.h's
 * runs; the AVX2 driver's B micro-panel stays outer, so this is a plain loop) */
static void kernel_run(int rows, int64_t kc, const float *a, int64_t a_ld, const float *b,
                       int64_t b_ld, int64_t b_step, int64_t np, float *c, int64_t ldc, float beta)
{
    for (int64_t q = 0; q < np; q++)
        kernel(rows, kc, a, a_ld, b + q * b_step, b_ld, c + q * NR, ldc, NR, beta);
}

/* ---- drivers (gemm_blocked.h) ------------------------------------------------- */

#include "gemm_blocked.h"

/* ---- small C, long K: the dot products' tile (driver: gemm_dot.h) -------------- */

#define DOT_R 3 /* rows of A and of B^T per tile: 9 accumulators, 6 loads for 9 FMAs */

static inline float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
}

/* part[r * n + q] = sum over p < kc of a[r * lda + p] * b[q * ldb + p], r < RM, q < RN.
 * Lane j of each accumulator sums the products at p = j (mod 8) in order of p; the loads
 * start where b's first row reaches a 32-byte boundary and the lanes are rotated back at
 * the end, as in gemm_avx512.c's tile: the same sums wherever the rows lie. */
static inline __attribute__((always_inline)) void
dot_tile(const int RM, const int RN, int64_t kc, const float *a, int64_t lda, const float *b,
         int64_t ldb, float *part, int64_t n)
{
    __m256 acc[DOT_R][DOT_R], va[DOT_R], vb[DOT_R];
    for (int r = 0; r < RM; r++)
        for (int q = 0; q < RN; q++) acc[r][q] = _mm256_setzero_ps();
#define DOT_STEP(LOAD)                                                                 \
    do {                                                                               \
        for (int r = 0; r < RM; r++) va[r] = LOAD(a + r * lda + p);                    \
        for (int q = 0; q < RN; q++) vb[q] = LOAD(b + q * ldb + p);                    \
        for (int r = 0; r < RM; r++)                                                   \
            for (int q = 0; q < RN; q++) acc[r][q] = _mm256_fmadd_ps(va[r], vb[q], acc[r][q]); \
    } while (0)
#define DOT_MASKED(q) _mm256_maskload_ps(q, mk)
    const int s = (int)((0 - (uintptr_t)b) % 32 / sizeof(float));
    int64_t p = 0;
    if (s) { /* p < s in lanes 8 - s + p; lanes before the row are 0 in both */
        const __m256i mk = mdl_lane_mask(8 - s, 8 - s + kc);
        p = s - 8;
        DOT_STEP(DOT_MASKED);
        p = s;
    }
    for (; p + 8 <= kc; p += 8) DOT_STEP(_mm256_loadu_ps);
    if (p < kc) { /* the last products: lanes past kc are 0 in both */
        const __m256i mk = mdl_lane_mask(0, kc - p);
        DOT_STEP(DOT_MASKED);
    }
#undef DOT_MASKED
#undef DOT_STEP
    if (s) { /* lane j back to p = j (mod 8) */
        const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        const __m256i back = _mm256_and_si256(_mm256_sub_epi32(lane, _mm256_set1_epi32(s)),
                                              _mm256_set1_epi32(7));
        for (int r = 0; r < RM; r++)
            for (int q = 0; q < RN; q++) acc[r][q] = _mm256_permutevar8x32_ps(acc[r][q], back);
    }
    for (int r = 0; r < RM; r++)
        for (int q = 0; q < RN; q++) part[r * n + q] = hsum8(acc[r][q]);
}

#include "gemm_dot.h"

size_t mdl_sgemm_avx2_workspace_floats(int64_t m, int64_t n, int64_t k)
{
    return sgemm_workspace_floats(m, n, k);
}

void mdl_sgemm_avx2(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                    float *c, int64_t ldc, float *ws)
{
    sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, ws);
}

/* ---- pre-packed A, one thread (for callers that reuse A over many products) ---- */

size_t mdl_sgemm_avx2_packed_a_floats(int64_t m, int64_t k)
{
    return (size_t)(round_up(m, MR) * k);
}

/* K block pc (of plan_blocks' kc) starts at pa + pc * round_up(m, MR); in it, row
 * panel q at + q * MR * kb, packed as pack_a does; the panels shared among the threads
 * outside a parallel region (a convolution's weights, packed each call: for one image
 * of 512 x 512 channels at 4x4, a quarter of the call on one thread) */
void mdl_sgemm_avx2_pack_a(int trans_a, int64_t m, int64_t k, float alpha, const float *a,
                           int64_t lda, float *pa)
{
    const int64_t kc = plan_blocks(1, 1, k).kc, mp = round_up(m, MR), nq = mp / MR;
    const int64_t units = (k + kc - 1) / kc * nq;
#define PACK_UNIT(u)                                                                      \
    do {                                                                                  \
        const int64_t pc = (u) / nq * kc, q = (u) % nq, kb = k - pc < kc ? k - pc : kc;   \
        const int64_t rows = m - q * MR < MR ? m - q * MR : MR;                           \
        pack_a(trans_a, a, lda, q * MR, pc, (int)rows, kb, alpha, pa + pc * mp + q * MR * kb); \
    } while (0)
#ifdef _OPENMP
    const int nt = omp_in_parallel() ? 1 : mdl_threads_for((double)m * k);
    if (nt > 1) {
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int64_t u = 0; u < units; u++) PACK_UNIT(u);
        return;
    }
#endif
    for (int64_t u = 0; u < units; u++) PACK_UNIT(u);
#undef PACK_UNIT
}

/* d[r] = src[r * kk + kk - 1 - t] for r < rows, zero for rows <= r < MR */
static inline void flip_column(const float *src, int64_t kk, int rows, int64_t t, float *d)
{
    int r = 0;
    for (; r < rows; r++) d[r] = src[r * kk + kk - 1 - t];
    for (; r < MR; r++) d[r] = 0.0f;
}

/* d[t * MR + r] = src[r * kk + kk - 1 - t] for r < rows (zero for rows <= r < MR),
 * t < kk: one output channel's kernels of an A micro-panel's rows, flipped, as the
 * panel's kk columns.  Full panels 8 taps at a time: each row's 8 reversed, then
 * transposed, each column stored 8 wide over the next one's start, which is written
 * afterwards (the last 6 wide). */
static void flip_kernels(const float *src, int64_t kk, int rows, float *restrict d)
{
    int64_t t = 0;
    if (rows == MR) {
        const __m256i reverse = _mm256_setr_epi32(7, 6, 5, 4, 3, 2, 1, 0);
        for (; t + 8 <= kk; t += 8) {
            __m256 v[8];
            for (int r = 0; r < MR; r++) /* lane j: tap kk - 1 - t - j */
                v[r] = _mm256_permutevar8x32_ps(_mm256_loadu_ps(src + r * kk + kk - 8 - t),
                                                reverse);
            v[6] = v[7] = _mm256_setzero_ps();
            mdl_transpose8_ps(v);
            float *c = d + t * MR;
            for (int j = 0; j < 7; j++) _mm256_storeu_ps(c + j * MR, v[j]);
            _mm_storeu_ps(c + 7 * MR, _mm256_castps256_ps128(v[7]));
            _mm_storel_pi((__m64 *)(c + 7 * MR + 4), _mm256_extractf128_ps(v[7], 1));
        }
    }
    for (; t < kk; t++) flip_column(src, kk, rows, t, d + t * MR);
}

/* Channels [co0, co1) of mdl_sgemm_avx2_pack_flipped_weights, w read in order: each
 * channel's kernels of an A micro-panel's rows (MR x kk floats in a row of w) into the
 * panel's kk columns there */
static void pack_flipped(int64_t c_in, int64_t c_out, int64_t kk, const float *w, int64_t co0,
                         int64_t co1, float *pa)
{
    const int64_t k = c_out * kk, kc = plan_blocks(1, 1, k).kc, mp = round_up(c_in, MR);
    for (int64_t co = co0; co < co1; co++)
        for (int64_t i0 = 0; i0 < c_in; i0 += MR) {
            const int rows = c_in - i0 < MR ? (int)(c_in - i0) : MR;
            const float *src = w + (co * c_in + i0) * kk;
            const int64_t p0 = co * kk, pc = p0 / kc * kc;
            if (p0 + kk <= pc + kc) { /* in one K block */
                const int64_t kb = k - pc < kc ? k - pc : kc;
                flip_kernels(src, kk, rows, pa + pc * mp + i0 * kb + (p0 - pc) * MR);
                continue;
            }
            for (int64_t t = 0; t < kk; t++) { /* across two K blocks: column by column */
                const int64_t p = p0 + t, b = p / kc * kc, kb = k - b < kc ? k - b : kc;
                flip_column(src, kk, rows, t, pa + b * mp + i0 * kb + (p - b) * MR);
            }
        }
}

void mdl_sgemm_avx2_pack_flipped_weights(int64_t c_in, int64_t c_out, int64_t kk,
                                         const float *w, float *pa)
{
    if (kk == 1) { /* w is op(A) transposed */
        mdl_sgemm_avx2_pack_a(1, c_in, c_out, 1.0f, w, c_in, pa);
        return;
    }
#ifdef _OPENMP
    const int nt = omp_in_parallel() ? 1 : mdl_threads_for((double)c_in * c_out * kk);
    if (nt > 1) {
#pragma omp parallel num_threads(nt)
        {
            const int t = omp_get_thread_num(), T = omp_get_num_threads();
            pack_flipped(c_in, c_out, kk, w, c_out * t / T, c_out * (t + 1) / T, pa);
        }
        return;
    }
#endif
    pack_flipped(c_in, c_out, kk, w, 0, c_out, pa);
}

/* Columns of B that mdl_sgemm_avx2_packed packs at a time: a kc x PACKED_NC block
 * (at most 400 KiB) stays in L2 while each row tile of A, in L1, passes over all of it.
 * With one 16-column panel at a time, A (the weights) streamed from L3 once per panel:
 * a 512 x 2304 A ran at 0.8x when its images went 8 to a product instead of one. */
#define PACKED_NC 320

size_t mdl_sgemm_avx2_packed_b_floats(int64_t k)
{
    return (size_t)(plan_blocks(1, 1, k).kc * PACKED_NC);
}

void mdl_sgemm_avx2_packed(int trans_b, int64_t m, int64_t n, int64_t k, const float *pa,
                           const float *b, int64_t ldb, float beta, float *c, int64_t ldc,
                           const mdl_epilogue *ep, float *bbuf)
{
    mdl_sgemm_avx2_packed_rows(trans_b, m, 0, m, n, k, pa, 0, b, ldb, beta, c, ldc, ep, bbuf);
}

/* K block pc of rows i.. of A: packed (lda 0), or A itself, rows lda floats apart */
static const float *a_block(const float *pa, int64_t lda, int64_t mp, int64_t pc, int64_t kb,
                            int64_t i)
{
    return lda ? pa + i * lda + pc : pa + pc * mp + i * kb;
}

void mdl_sgemm_avx2_packed_rows(int trans_b, int64_t m, int64_t i0, int64_t i1, int64_t n,
                                int64_t k, const float *pa, int64_t lda, const float *b,
                                int64_t ldb, float beta, float *c, int64_t ldc,
                                const mdl_epilogue *ep, float *bbuf)
{
    const int64_t kc = plan_blocks(1, 1, k).kc, mp = round_up(m, MR);
    for (int64_t pc = 0; pc < k; pc += kc) {
        const int64_t kb = k - pc < kc ? k - pc : kc;
        const float beta_eff = pc == 0 ? beta : 1.0f;
        const mdl_epilogue *last = pc + kb == k ? ep : NULL;
        for (int64_t jc = 0; jc < n; jc += PACKED_NC) {
            const int64_t nc = n - jc < PACKED_NC ? n - jc : PACKED_NC;
            for (int64_t j = 0; j < nc; j += NR)
                pack_b(trans_b, b, ldb, jc + j, pc, nc - j < NR ? (int)(nc - j) : NR, kb,
                       bbuf + j * kb);
            /* each row's tiles in column order, as before the blocking: the same sums */
            for (int64_t i = i0; i < i1; i += MR) {
                const int rows = i1 - i < MR ? (int)(i1 - i) : MR;
                for (int64_t j = 0; j < nc; j += NR)
                    tile(rows, kb, a_block(pa, lda, mp, pc, kb, i), lda, bbuf + j * kb, 0,
                         NULL, 0, c + i * ldc + jc + j, ldc, nc - j < NR ? (int)(nc - j) : NR,
                         beta_eff, last, i);
            }
        }
    }
}

/* Rows [i0, i1) of one 16-column panel of C (m x 16) = pa @ B with B's rows read in
 * place: row p is the 8 floats at b + off[p] followed by the 8 at b + off[p] + half. */
static void packed_rows(int64_t m, int64_t i0, int64_t i1, int64_t k, const float *pa,
                        int64_t lda, const float *b, const int64_t *off, int64_t half, float beta,
                        float *c, int64_t ldc, const mdl_epilogue *ep)
{
    const int64_t kc = plan_blocks(1, 1, k).kc, mp = round_up(m, MR);
    for (int64_t pc = 0; pc < k; pc += kc) {
        const int64_t kb = k - pc < kc ? k - pc : kc;
        const float beta_eff = pc == 0 ? beta : 1.0f;
        const mdl_epilogue *last = pc + kb == k ? ep : NULL;
        for (int64_t i = i0; i < i1; i += MR) {
            const int rows = i1 - i < MR ? (int)(i1 - i) : MR;
            tile(rows, kb, a_block(pa, lda, mp, pc, kb, i), lda, b, 0, off + pc, half,
                 c + i * ldc, ldc, NR, beta_eff, last, i);
        }
    }
}
void mdl_sgemm_avx2_packed_image(int64_t m, int64_t k, const float *pa, const float *b,
                                 int64_t cols, int64_t ld, int64_t n, const int64_t *off,
                                 float beta, float *c, int64_t ldc, const mdl_epilogue *ep)
{
    mdl_sgemm_avx2_packed_image_rows(m, 0, m, k, pa, 0, b, cols, ld, n, off, beta, c, ldc, ep);
}

void mdl_sgemm_avx2_packed_image_rows(int64_t m, int64_t i0, int64_t i1, int64_t k,
                                      const float *pa, int64_t lda, const float *b, int64_t cols,
                                      int64_t ld, int64_t n, const int64_t *off, float beta,
                                      float *c, int64_t ldc, const mdl_epilogue *ep)
{
    const int64_t half = cols == 8 ? ld : 8;
    for (int64_t j = 0; j < n; j += 16)
        packed_rows(m, i0, i1, k, pa, lda, b + mdl_rows_panel(j, cols, ld), off, half, beta,
                    c + j, ldc, ep);
}
#endif
