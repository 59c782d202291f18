/* gemm_avx512.c -- blocked AVX-512F SGEMM (compiled with -mavx512f -mavx2 -mfma).
 *
 * C[m,n] = alpha * op(A) @ op(B) + beta * C, row-major, the same contract as
 * gemm_avx2.c (see gemm.h), through the drivers of gemm_blocked.h.
 *
 * Packed B holds op(B) in micro-panels of NR = 32 columns.  The micro-kernel keeps
 * an MR x 32 tile of C in 2 * MR zmm accumulators (MR = 14: 28 of the 32
 * registers) and broadcasts each element of A.  Tiles with fewer rows use the
 * same kernel specialised for that row count; tiles with fewer columns load and
 * store C, and B read in place, through lane masks.
 *
 * The convolution's products with an image's rows read in place
 * (mdl_sgemm_avx512_packed_image) are in gemm_image_avx512.c.
 *
 * On Zen 4 a 512-bit FMA issues as two 256-bit halves, so the arithmetic peak
 * is that of AVX2; what AVX-512 buys is the register count (a 14 x 32 tile:
 * 28 FMAs per 2 loads of B, against 12 per 2 in the 6 x 16 AVX2 tile) and the
 * masked edges. */
#include "common.h"
#if MDL_X86
#include <immintrin.h>
#include <string.h>
#include "gemm.h"
#include "simd_avx2.h"

#ifndef MR
#  define MR 14      /* rows of a micro-tile (<= 14: 2 * MR accumulators + B + spare) */
#endif
#ifndef NRV
#  define NRV 2      /* zmm vectors per row of a micro-tile (2 or 4) */
#endif
#define NR (16 * NRV)  /* columns of a micro-tile: 32 (a 6 x 64 tile measured no faster) */
#ifndef KC_MAX
#  define KC_MAX 384 /* A micro-panel MR x kc floats: 21 KiB at MR = 14, stays in L1 */
#endif
#ifndef NG
#  define NG 8       /* B micro-panels per column group: 8 x 32 x 384 floats = 384 KiB, in L2 */
#endif
/* K of at most SHORT_K: tiles of at most 8 rows, L1's ways (gemm_blocked.h's
 * tile_rows; C's rows 4 KiB apart, 2 threads, 144 x 12288 x 16 and 75 x 19456 x 32 with
 * op(A) transposed 1.10-1.19x) */
#define SHORT_K 32
#define SHORT_MR 8
#define MB_MAX (MR * 110)  /* rows of A packed per step (1540 at MR = 14) */
#define MC_PANELS (MB_MAX / MR) /* a row group is all of the block's rows */
#define B_PANEL_OUTER 0
#define LAZY_B 1
#define LAZY_NG NG
#define NC_MAX 4096        /* columns of B packed per step */
/* The rows- and columns-split drivers: when one K block of all of op(B)'s columns
 * fits in L2 (ROWS_SPLIT_BLOCK floats) and all of op(B) packed is small
 * (ROWS_SPLIT_B_MAX).  Columns split for C of at most COLS_SPLIT_M rows (two
 * micro-panels), op(B) then read in place when it is not transposed. */
#ifndef ROWS_SPLIT_BLOCK
#  define ROWS_SPLIT_BLOCK (128 * 1024)
#endif
#ifndef ROWS_SPLIT_B_MAX
#  define ROWS_SPLIT_B_MAX (512 * 1024)
#endif
#define COLS_SPLIT_M (2 * MR)
#define COLS_SPLIT_IN_PLACE_M COLS_SPLIT_M
/* The shared-blocks driver reads op(B) in place (not transposed, rows 64-byte
 * aligned) when C has at most this many rows: each element of B then serves too
 * few rows to repay packing it (measured on Zen 4: 64 x 1024 x 576 and 128 x 4096 x
 * 1152 gain 15-25%, squares of 1024 lose 10%, 256 x 1024 x 2304 is even; rows 16 bytes
 * off the alignment cost 128 x 4096 x 1152 40%, every load then spanning two lines).
 * On Intel's cores with two 512-bit FMA units packing measured faster for all of them
 * (32 x 2304 x 800 1.37x, 64 x 3264 x 576 1.27x, 96 and 128 rows even): there it
 * packs (mdl_set_sgemm_b, MDL_SGEMM_B_AUTO). */
#define SHARED_IN_PLACE_M (mdl_sgemm_b_in_place() ? 256 : 0)
/* ... and whatever the rows' alignment when C has at most this many rows: packing then
 * costs more than the loads that span two lines (B 16 bytes into a line, 2 threads,
 * Zen 4: 16 x 12288 x 144 1.22x, 32 x 6400 x 288 1.14x, 48 x 10000 x 200 1.24x, 64 x 3264
 * x 576 1.07x; from 96 rows it loses: 96 x 4096 x 576 0.86x, 128 x 4096 x 1152 0.77x) */
#define SHARED_IN_PLACE_UNALIGNED_M (mdl_sgemm_b_in_place() ? 64 : 0)

/* The lowest `count` lanes (count clamped to [0, 16]). */
static inline __mmask16 lanes(int64_t count)
{
    return count >= 16 ? (__mmask16)0xFFFF : count <= 0 ? (__mmask16)0 : (__mmask16)((1u << count) - 1);
}

/* ---- packing ------------------------------------------------------------------ */

/* Store the low `count` floats of an 8-wide vector (count <= 8). */
static inline void store8_lanes(float *dst, __m256 v, int count)
{
    if (count == 8) _mm256_storeu_ps(dst, v);
    else _mm512_mask_storeu_ps(dst, lanes(count), _mm512_castps256_ps512(v));
}

/* One A micro-panel: dst[p * MR + r] = alpha * op(A)[i0 + r][p0 + p] for
 * r < rows (zero for rows <= r < MR), p < kc. */
static void pack_a(int trans_a, const float *a, int64_t lda, int64_t i0, int64_t p0,
                   int rows, int64_t kc, float alpha, float *restrict dst)
{
    if (trans_a) { /* op(A)[i][p] = a[p * lda + i]: rows contiguous floats per p */
        const __m512 va = _mm512_set1_ps(alpha);
        const __mmask16 in = lanes(rows), out = lanes(MR);
        for (int64_t p = 0; p < kc; p++) {
            __m512 v = _mm512_maskz_loadu_ps(in, a + (p0 + p) * lda + i0);
            _mm512_mask_storeu_ps(dst + p * MR, out, _mm512_mul_ps(va, v));
        }
        return;
    }
    /* op(A)[i][p] = a[i * lda + p]: rows are contiguous in p; transpose 8 x 8
     * blocks, rows [0, 8) and [8, MR) */
    const float *src[16];
    for (int r = 0; r < 16; r++) src[r] = a + (i0 + (r < rows ? r : 0)) * lda + p0;
    const __m256 va = _mm256_set1_ps(alpha), zero = _mm256_setzero_ps();
    int64_t p = 0;
    for (; p + 8 <= kc; p += 8) {
        for (int h = 0; h * 8 < MR; h++) {
            __m256 v[8];
            for (int r = 0; r < 8; r++)
                v[r] = h * 8 + r < rows ? _mm256_mul_ps(va, _mm256_loadu_ps(src[h * 8 + r] + p))
                                        : zero;
            mdl_transpose8_ps(v);
            const int width = MR - h * 8 < 8 ? MR - h * 8 : 8;
            for (int q = 0; q < 8; q++) store8_lanes(dst + (p + q) * MR + h * 8, v[q], width);
        }
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
            for (int64_t p = 0; p < kc; p++)
                for (int v = 0; v < NRV; v++)
                    _mm512_store_ps(dst + p * NR + 16 * v, _mm512_loadu_ps(src + p * ldb + 16 * v));
        } else {
            __mmask16 mk[NRV];
            for (int v = 0; v < NRV; v++) mk[v] = lanes(cols - 16 * v);
            for (int64_t p = 0; p < kc; p++)
                for (int v = 0; v < NRV; v++)
                    _mm512_store_ps(dst + p * NR + 16 * v,
                                    _mm512_maskz_loadu_ps(mk[v], src + p * ldb + 16 * v));
        }
        return;
    }
    /* op(B)[p][j] = b[j * ldb + p]: columns of op(B) are contiguous in p.  16
     * columns at a time over all of kc, so that no more than 16 source rows are
     * streamed at once (the hardware prefetchers track a limited number) */
    const float *src[NR];
    for (int j = 0; j < NR; j++) src[j] = b + (j0 + (j < cols ? j : 0)) * ldb + p0;
    const __m256 zero = _mm256_setzero_ps();
    const int64_t kc8 = kc & ~(int64_t)7;
    for (int hh = 0; hh < NR / 16; hh++) {
        if (hh * 16 >= cols) {
            for (int64_t p = 0; p < kc8; p++) _mm512_store_ps(dst + p * NR + hh * 16, _mm512_setzero_ps());
            continue;
        }
        for (int64_t p = 0; p < kc8; p += 8) {
            for (int h = 2 * hh; h < 2 * hh + 2; h++) {
                __m256 v[8];
                for (int j = 0; j < 8; j++)
                    v[j] = h * 8 + j < cols ? _mm256_loadu_ps(src[h * 8 + j] + p) : zero;
                mdl_transpose8_ps(v);
                for (int q = 0; q < 8; q++) _mm256_store_ps(dst + (p + q) * NR + h * 8, v[q]);
            }
        }
    }
    for (int64_t p = kc8; p < kc; p++) {
        int j = 0;
        for (; j < cols; j++) dst[p * NR + j] = src[j][p];
        for (; j < NR; j++) dst[p * NR + j] = 0.0f;
    }
}

/* ---- micro-kernel ------------------------------------------------------------- */

/* C tile (ROWS x cols, ROWS <= MR, cols <= NR) = A micro-panel (packed, or in place
 * with AIN: row r at a + r * lda_) @ B micro-panel (packed, or in place with
 * INPLACE: row p at b + p * ldb) + beta * C
 * (beta == 0: C is not read).  Named accumulators
 * (not an array) so that they stay in registers; rows >= ROWS fold away. */
#define ROW_FMA(r)                                                            \
    if (ROWS > r) {                                                           \
        const __m512 av = _mm512_set1_ps(AIN ? a[r * lda_ + p] : a[p * MR + r]); \
        c##r##_0 = _mm512_fmadd_ps(av, b0, c##r##_0);                         \
        c##r##_1 = _mm512_fmadd_ps(av, b1, c##r##_1);                         \
        if (NRV > 2) {                                                        \
            c##r##_2 = _mm512_fmadd_ps(av, b2, c##r##_2);                     \
            c##r##_3 = _mm512_fmadd_ps(av, b3, c##r##_3);                     \
        }                                                                     \
    }
#define ROW_STORE(r)                                                          \
    if (ROWS > r) {                                                           \
        _mm512_storeu_ps(c + r * ldc, c##r##_0);                              \
        _mm512_storeu_ps(c + r * ldc + 16, c##r##_1);                         \
        if (NRV > 2) {                                                        \
            _mm512_storeu_ps(c + r * ldc + 32, c##r##_2);                     \
            _mm512_storeu_ps(c + r * ldc + 48, c##r##_3);                     \
        }                                                                     \
    }
#define ROW_UPDATE(r)                                                         \
    if (ROWS > r) {                                                           \
        float *cr = c + r * ldc;                                              \
        _mm512_storeu_ps(cr, _mm512_fmadd_ps(vb, _mm512_loadu_ps(cr), c##r##_0));           \
        _mm512_storeu_ps(cr + 16, _mm512_fmadd_ps(vb, _mm512_loadu_ps(cr + 16), c##r##_1)); \
        if (NRV > 2) {                                                        \
            _mm512_storeu_ps(cr + 32, _mm512_fmadd_ps(vb, _mm512_loadu_ps(cr + 32), c##r##_2)); \
            _mm512_storeu_ps(cr + 48, _mm512_fmadd_ps(vb, _mm512_loadu_ps(cr + 48), c##r##_3)); \
        }                                                                     \
    }
#define ROW_STORE_MASKED(r)                                                   \
    if (ROWS > r) {                                                           \
        _mm512_mask_storeu_ps(c + r * ldc, m0, c##r##_0);                     \
        _mm512_mask_storeu_ps(c + r * ldc + 16, m1, c##r##_1);                \
        if (NRV > 2) {                                                        \
            _mm512_mask_storeu_ps(c + r * ldc + 32, m2, c##r##_2);            \
            _mm512_mask_storeu_ps(c + r * ldc + 48, m3, c##r##_3);            \
        }                                                                     \
    }
#define ROW_UPDATE_MASKED(r)                                                  \
    if (ROWS > r) {                                                           \
        float *cr = c + r * ldc;                                              \
        _mm512_mask_storeu_ps(cr, m0,                                         \
            _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, cr), c##r##_0));    \
        _mm512_mask_storeu_ps(cr + 16, m1,                                    \
            _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, cr + 16), c##r##_1)); \
        if (NRV > 2) {                                                        \
            _mm512_mask_storeu_ps(cr + 32, m2,                                \
                _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m2, cr + 32), c##r##_2)); \
            _mm512_mask_storeu_ps(cr + 48, m3,                                \
                _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m3, cr + 48), c##r##_3)); \
        }                                                                     \
    }
#define ALL_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13)
#define ROW_PREFETCH(r)                                                       \
    if (ROWS > r) {                                                           \
        _mm_prefetch((const char *)(c + r * ldc), _MM_HINT_T0);               \
        _mm_prefetch((const char *)(c + r * ldc + NR - 1), _MM_HINT_T0);      \
        if (NRV > 2) {                                                        \
            _mm_prefetch((const char *)(c + r * ldc + 16), _MM_HINT_T0);      \
            _mm_prefetch((const char *)(c + r * ldc + 32), _MM_HINT_T0);      \
        }                                                                     \
    }

#if MR > 14 || NRV * MR > 28 || (NRV != 2 && NRV != 4)
#  error "the micro-kernel holds 28 accumulators: MR <= 14 rows of 2 or MR <= 7 of 4 vectors"
#endif

/* 16 floats of a row of B: packed (INPLACE 0: aligned, whole), or in place (1:
 * lanes past the tile's columns are not read; 2: a whole tile, plain loads, 4-5%
 * faster than masked ones on Zen 4; 3: as 2, see kernel_next) */
static inline __attribute__((always_inline)) __m512
load_b(const int INPLACE, __mmask16 mask, const float *p)
{
    return INPLACE == 1 ? _mm512_maskz_loadu_ps(mask, p)
         : INPLACE >= 2 ? _mm512_loadu_ps(p) : _mm512_load_ps(p);
}

static inline __attribute__((always_inline)) void
kernel_rows(const int ROWS, const int INPLACE, const int AIN, int64_t lda_, int64_t kc,
            const float *restrict a, const float *restrict b, int64_t ldb, float *c, int64_t ldc,
            int cols, float beta)
{
    __m512 c0_0 = _mm512_setzero_ps(), c0_1 = c0_0, c1_0 = c0_0, c1_1 = c0_0, c2_0 = c0_0;
    __m512 c2_1 = c0_0, c3_0 = c0_0, c3_1 = c0_0, c4_0 = c0_0, c4_1 = c0_0, c5_0 = c0_0;
    __m512 c5_1 = c0_0, c6_0 = c0_0, c6_1 = c0_0, c7_0 = c0_0, c7_1 = c0_0, c8_0 = c0_0;
    __m512 c8_1 = c0_0, c9_0 = c0_0, c9_1 = c0_0, c10_0 = c0_0, c10_1 = c0_0, c11_0 = c0_0;
    __m512 c11_1 = c0_0, c12_0 = c0_0, c12_1 = c0_0, c13_0 = c0_0, c13_1 = c0_0;
    /* the third and fourth vectors of each row, for NRV == 4 (MR <= 7) */
    __m512 c0_2 = c0_0, c0_3 = c0_0, c1_2 = c0_0, c1_3 = c0_0, c2_2 = c0_0, c2_3 = c0_0;
    __m512 c3_2 = c0_0, c3_3 = c0_0, c4_2 = c0_0, c4_3 = c0_0, c5_2 = c0_0, c5_3 = c0_0;
    __m512 c6_2 = c0_0, c6_3 = c0_0;
    __m512 c7_2 = c0_0, c7_3 = c0_0, c8_2 = c0_0, c8_3 = c0_0, c9_2 = c0_0, c9_3 = c0_0;
    __m512 c10_2 = c0_0, c10_3 = c0_0, c11_2 = c0_0, c11_3 = c0_0, c12_2 = c0_0, c12_3 = c0_0;
    __m512 c13_2 = c0_0, c13_3 = c0_0;
    if (beta != 0.0f) { /* C is read only then (beta == 0: 16 x 1024 x 27 1.04x) */
        ALL_ROWS(ROW_PREFETCH)
    }
    const __mmask16 m0 = lanes(cols), m1 = lanes(cols - 16), m2 = lanes(cols - 32),
                    m3 = lanes(cols - 48);
#pragma GCC unroll 4
    for (int64_t p = 0; p < kc; p++) {
        const float *bp = b + p * ldb;
        if (INPLACE == 3) { /* the next micro-panel's row, into L2 */
            _mm_prefetch((const char *)(bp + NR), _MM_HINT_T1);
            _mm_prefetch((const char *)(bp + NR + 16 * NRV - 1), _MM_HINT_T1);
        }
        const __m512 b0 = load_b(INPLACE, m0, bp), b1 = load_b(INPLACE, m1, bp + 16);
        __m512 b2 = b0, b3 = b0;
        if (NRV > 2) {
            b2 = load_b(INPLACE, m2, bp + 32);
            b3 = load_b(INPLACE, m3, bp + 48);
        }
        ALL_ROWS(ROW_FMA)
    }
    if (cols == NR) {
        if (beta == 0.0f) {
            ALL_ROWS(ROW_STORE)
        } else {
            const __m512 vb = _mm512_set1_ps(beta);
            ALL_ROWS(ROW_UPDATE)
        }
        return;
    }
    if (beta == 0.0f) {
        ALL_ROWS(ROW_STORE_MASKED)
    } else {
        const __m512 vb = _mm512_set1_ps(beta);
        ALL_ROWS(ROW_UPDATE_MASKED)
    }
}

/* The cases of a switch over a tile's rows, 1 to MR (the ones above MR never taken) */
#define ROW_CASES(CASE)                                                                     \
    CASE(14) CASE(13) CASE(12) CASE(11) CASE(10) CASE(9) CASE(8) CASE(7) CASE(6) CASE(5)    \
    CASE(4) CASE(3) CASE(2) default: CASE(1)

/* The tile kernel for `rows` rows, A packed (a_ld == 0: a micro-panel of MR rows) or
 * read in place (row stride a_ld), B packed (b_ld == 0: micro-panels of NR columns)
 * or read in place (row stride b_ld). */
static void kernel(int rows, int64_t kc, const float *a, int64_t a_ld, const float *b, int64_t b_ld,
                   float *c, int64_t ldc, int cols, float beta)
{
    const int b_in = b_ld == 0 ? 0 : cols == NR ? 2 : 1; /* load_b's INPLACE */
#define KERNEL_CASE(R)                                                                     \
    case R:                                                                               \
        if (b_in == 2 && a_ld) kernel_rows(R, 2, 1, a_ld, kc, a, b, b_ld, c, ldc, cols, beta); \
        else if (b_in == 2) kernel_rows(R, 2, 0, 0, kc, a, b, b_ld, c, ldc, cols, beta);   \
        else if (b_in && a_ld) kernel_rows(R, 1, 1, a_ld, kc, a, b, b_ld, c, ldc, cols, beta); \
        else if (a_ld) kernel_rows(R, 0, 1, a_ld, kc, a, b, NR, c, ldc, cols, beta);      \
        else if (b_in) kernel_rows(R, 1, 0, 0, kc, a, b, b_ld, c, ldc, cols, beta);       \
        else kernel_rows(R, 0, 0, 0, kc, a, b, NR, c, ldc, cols, beta);                   \
        break;
    switch (rows) { ROW_CASES(KERNEL_CASE) }
#undef KERNEL_CASE
}

/* A full-width tile of kernel()'s with B in place (row stride b_ld) that prefetches
 * the next micro-panel's rows (b + NR, the same stride) into L2 as it goes.  The
 * rows are b_ld apart, too far for the hardware's prefetchers, so each line of B
 * in place is otherwise a demand miss (16 x 12288 x 144, 2 threads, 1.3x) */
static void kernel_next(int rows, int64_t kc, const float *a, int64_t a_ld, const float *b,
                        int64_t b_ld, float *c, int64_t ldc, float beta)
{
#define NEXT_CASE(R)                                                                        \
    case R:                                                                                 \
        if (a_ld) kernel_rows(R, 3, 1, a_ld, kc, a, b, b_ld, c, ldc, NR, beta);              \
        else kernel_rows(R, 3, 0, 0, kc, a, b, b_ld, c, ldc, NR, beta);                      \
        break;
    switch (rows) { ROW_CASES(NEXT_CASE) }
#undef NEXT_CASE
}

/* np full-width tiles side by side (C's columns [0, np * NR)), B micro-panel q at b + q *
 * b_step, packed (b_ld == 0) or in place: one dispatch for a run of gemm_blocked.h's.
 * kernel() keeps its own dispatch without the loop: kernel() as this with np = 1 cost
 * 16 x 1024 x 27 9-12% and 100 x 100 x 20 2-4% */
static void kernel_run(int rows, int64_t kc, const float *a, int64_t a_ld, const float *b,
                       int64_t b_ld, int64_t b_step, int64_t np, float *c, int64_t ldc, float beta)
{
#define RUN(R, INPLACE, AIN)                                                                 \
    for (int64_t q = 0; q < np; q++)                                                        \
        kernel_rows(R, INPLACE, AIN, a_ld, kc, a, b + q * b_step, INPLACE ? b_ld : NR,       \
                    c + q * NR, ldc, NR, beta)
/* B in place (b_step == NR): each tile but the last prefetches the next one's B */
#define RUN_IN_PLACE(R, AIN)                                                                 \
    do {                                                                                     \
        for (int64_t q = 0; q + 1 < np; q++)                                                \
            kernel_rows(R, 3, AIN, a_ld, kc, a, b + q * NR, b_ld, c + q * NR, ldc, NR, beta); \
        kernel_rows(R, 2, AIN, a_ld, kc, a, b + (np - 1) * NR, b_ld, c + (np - 1) * NR, ldc,  \
                    NR, beta);                                                               \
    } while (0)
#define RUN_CASE(R)                                                                          \
    case R:                                                                                  \
        if (b_ld && a_ld) RUN_IN_PLACE(R, 1);                                                \
        else if (b_ld) RUN_IN_PLACE(R, 0);                                                   \
        else if (a_ld) RUN(R, 0, 1);                                                         \
        else RUN(R, 0, 0);                                                                   \
        break;
    switch (rows) { ROW_CASES(RUN_CASE) }
#undef RUN_CASE
#undef RUN_IN_PLACE
#undef RUN
}

/* ---- drivers (gemm_blocked.h) ------------------------------------------------- */

#define B_ALIGN 16 /* floats in a zmm */
#include "gemm_blocked.h"

/* ---- small C, long K: the dot products' tile (driver: gemm_dot.h) --------------- */

#define DOT_R 4 /* rows of A and of B^T per tile: 16 accumulators, 8 loads for 16 FMAs */

/* Lane i = the sum of the 16 lanes of v[i / 4][i % 4]: pairs of vectors folded by
 * lanes, then 64-bit pairs, then 128-bit quarters (about 45 instructions, against about 130 for
 * 16 separate reductions) */
static inline __attribute__((always_inline)) __m512 sum16(__m512 v[DOT_R][DOT_R])
{
    __m512 b[8], c[4];
    for (int j = 0; j < 8; j++) { /* in each quarter: x0+x2, y0+y2, x1+x3, y1+y3 */
        const __m512 x = v[2 * j / DOT_R][2 * j % DOT_R];
        const __m512 y = v[(2 * j + 1) / DOT_R][(2 * j + 1) % DOT_R];
        b[j] = _mm512_add_ps(_mm512_unpacklo_ps(x, y), _mm512_unpackhi_ps(x, y));
    }
    for (int j = 0; j < 4; j++) { /* in each quarter: its sums of v[4j], ..., v[4j + 3] */
        const __m512d x = _mm512_castps_pd(b[2 * j]), y = _mm512_castps_pd(b[2 * j + 1]);
        c[j] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    /* the quarters: c0's and c1's 0 + 1 and 2 + 3, then c2's and c3's, then across */
    const __m512 e01 = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                     _mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512 e23 = _mm512_add_ps(_mm512_shuffle_f32x4(c[2], c[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                     _mm512_shuffle_f32x4(c[2], c[3], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(e01, e23, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(e01, e23, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* part[r * n + q] = sum over p < kc of a[r * lda + p] * b[q * ldb + p], r < RM, q < RN.
 * Lane j of each accumulator sums the products at p = j (mod 16) in order of p.  The
 * loads start where b's first row reaches a 64-byte line, s floats in: the first s
 * products go masked into the top s lanes, lane j then holds p = s + j (mod 16) to the
 * end and is rotated back, so the sums are the same to the bit wherever the rows lie
 * while no load of b's rows spans two lines. */
static inline __attribute__((always_inline)) void
dot_tile(const int RM, const int RN, int64_t kc, const float *a, int64_t lda, const float *b,
         int64_t ldb, float *part, int64_t n)
{
    __m512 acc[DOT_R][DOT_R], va[DOT_R], vb[DOT_R];
    for (int r = 0; r < DOT_R; r++) /* all of them: sum16 reads them all */
        for (int q = 0; q < DOT_R; q++) acc[r][q] = _mm512_setzero_ps();
#define DOT_STEP(LOAD)                                                                 \
    do {                                                                               \
        for (int r = 0; r < RM; r++) va[r] = LOAD(a + r * lda + p);                    \
        for (int q = 0; q < RN; q++) vb[q] = LOAD(b + q * ldb + p);                    \
        for (int r = 0; r < RM; r++)                                                   \
            for (int q = 0; q < RN; q++) acc[r][q] = _mm512_fmadd_ps(va[r], vb[q], acc[r][q]); \
    } while (0)
#define DOT_MASKED(q) _mm512_maskz_loadu_ps(mk, q)
    const int s = (int)((0 - (uintptr_t)b) % 64 / sizeof(float));
    int64_t p = 0;
    if (s) { /* p < s in lanes 16 - s + p; lanes before the row are 0 in both */
        const __mmask16 mk = (__mmask16)(lanes(16) << (16 - s)) & lanes(16 - s + kc);
        p = s - 16;
        DOT_STEP(DOT_MASKED);
        p = s;
    }
    for (; p + 16 <= kc; p += 16) DOT_STEP(_mm512_loadu_ps);
    if (p < kc) { /* the last products: lanes past kc are 0 in both */
        const __mmask16 mk = lanes(kc - p);
        DOT_STEP(DOT_MASKED);
    }
#undef DOT_MASKED
#undef DOT_STEP
    if (s) { /* lane j back to p = j (mod 16) */
        const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13,
                                               14, 15);
        const __m512i back = _mm512_and_si512(_mm512_sub_epi32(lane, _mm512_set1_epi32(s)),
                                              _mm512_set1_epi32(15));
        for (int r = 0; r < RM; r++)
            for (int q = 0; q < RN; q++) acc[r][q] = _mm512_permutexvar_ps(back, acc[r][q]);
    }
    float sums[16];
    _mm512_storeu_ps(sums, sum16(acc));
    for (int r = 0; r < RM; r++)
        for (int q = 0; q < RN; q++) part[r * n + q] = sums[r * DOT_R + q];
}

#include "gemm_dot.h"

size_t mdl_sgemm_avx512_workspace_floats(int64_t m, int64_t n, int64_t k)
{
    return sgemm_workspace_floats(m, n, k);
}

void mdl_sgemm_avx512(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                      const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                      float *c, int64_t ldc, float *ws)
{
    sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, ws);
}

#endif
