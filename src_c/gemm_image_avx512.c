/* gemm_image_avx512.c -- the convolution's AVX-512F products with B's rows read in
 * place from an image (compiled with -mavx512f -mavx2 -mfma): weights packed in
 * 8-row panels times an image's rows, in tiles of 8 output channels x 48 pixels; the
 * contract of mdl_sgemm_avx2_packed_image (gemm.h).  Apart from gemm_avx512.c's
 * SGEMM so that the two, the core's longest compiles, build side by side. */
#include "common.h"
#if MDL_X86
#include <immintrin.h>
#include "gemm.h"

/* K in blocks of at most KC_MAX rows: an A panel of 8 x 384 floats (12 KiB) stays
 * in L1 while a block's tiles sweep the image */
#define KC_MAX 384

static int64_t k_block(int64_t k) { return ceil_div(k, ceil_div(k, KC_MAX)); }

/* 8 rows of C x RV vectors of 16 pixels: 24 accumulators, and per step of K RR
 * broadcasts of A and RV loads of B for RR * RV FMAs (a 16 x 16 tile, one vector per
 * row, did 17 loads per 16 FMAs and ran at 65-77 GFLOP/s on an Ice Lake core whose
 * FMA peak is 170: load-bound; 8 x 48 reached 134-139 on the same K = 75 and 800
 * products) */
#define RR 8
#define RV 3

size_t mdl_sgemm_avx512_rows_a_floats(int64_t m, int64_t k)
{
    return (size_t)(round_up(m, RR) * k);
}

/* K block pc (of k_block(k) rows) at pa + pc * round_up(m, RR); in it, row panel q
 * at + q * RR * kb, element (r, p) at [p * RR + r], rows past m zero. */
void mdl_sgemm_avx512_rows_pack_a(int64_t m, int64_t k, const float *a, int64_t lda, float *pa)
{
    const int64_t kc = k_block(k), mp = round_up(m, RR);
    for (int64_t pc = 0; pc < k; pc += kc) {
        const int64_t kb = min64(k - pc, kc);
        for (int64_t q = 0; q * RR < m; q++) {
            float *dst = pa + pc * mp + q * RR * kb;
            for (int64_t r = 0; r < RR; r++)
                for (int64_t p = 0; p < kb; p++)
                    dst[p * RR + r] = q * RR + r < m ? a[(q * RR + r) * lda + pc + p] : 0.0f;
        }
    }
}

/* 16 pixels: contiguous (half == 8), or 8 at p and 8 at p + half */
static inline __attribute__((always_inline)) __m512 pixels16(const float *p, int64_t half)
{
    if (half == 8) return _mm512_loadu_ps(p);
    const __m512d lo = _mm512_castpd256_pd512(_mm256_castps_pd(_mm256_loadu_ps(p)));
    return _mm512_castpd_ps(_mm512_insertf64x4(lo, _mm256_castps_pd(_mm256_loadu_ps(p + half)), 1));
}

/* + bias[row], max(0, .), then row_sum[row] and row_sumsq[row] += the 16 values'
 * sums (see mdl_epilogue) */
static inline __attribute__((always_inline)) __m512
rows_epilogue(const mdl_epilogue *ep, int64_t row, __m512 v)
{
    if (ep->bias) v = _mm512_add_ps(v, _mm512_set1_ps(ep->bias[row]));
    if (ep->relu) v = _mm512_max_ps(_mm512_setzero_ps(), v); /* NaN passes */
    if (ep->row_sum) { /* shifted by their mean (mdl_add_shifted_sums) */
        const __m512 k = _mm512_set1_ps(_mm512_reduce_add_ps(v) / 16.0f), d = _mm512_sub_ps(v, k);
        mdl_add_shifted_sums(_mm512_cvtss_f32(k), 16.0, _mm512_reduce_add_ps(d),
                             _mm512_reduce_add_ps(_mm512_mul_ps(d, d)), ep->row_sum + row,
                             ep->row_sumsq + row);
    }
    return v;
}

#define R8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define RFMA(r)                                                                       \
    if (ROWS > r) {                                                                   \
        const __m512 av = _mm512_set1_ps(a[p * RR + r]);                              \
        c##r##_0 = _mm512_fmadd_ps(av, b0, c##r##_0);                                 \
        if (NV > 1) c##r##_1 = _mm512_fmadd_ps(av, b1, c##r##_1);                     \
        if (NV > 2) c##r##_2 = _mm512_fmadd_ps(av, b2, c##r##_2);                     \
    }
#define RSTORE(r, v)                                                                  \
    {                                                                                 \
        float *cr = c + r * ldc + 16 * v;                                             \
        if (beta != 0.0f) c##r##_##v = _mm512_fmadd_ps(vb, _mm512_loadu_ps(cr), c##r##_##v); \
        if (ep) c##r##_##v = rows_epilogue(ep, row0 + r, c##r##_##v);                 \
        _mm512_storeu_ps(cr, c##r##_##v);                                             \
    }
#define RFINISH(r)                                                                    \
    if (ROWS > r) {                                                                   \
        RSTORE(r, 0)                                                                  \
        if (NV > 1) RSTORE(r, 1)                                                      \
        if (NV > 2) RSTORE(r, 2)                                                      \
    }

/* C (ROWS x 16 NV) = A panel @ the kc rows of B, vector v's at b + o[v] + off[p]
 * (+ beta * C), then ep; with SEL, over the kc rows sel[0..kc) of the block only */
static inline __attribute__((always_inline)) void
rows_kernel(const int ROWS, const int NV, const int CONTIGUOUS, const int SEL, int64_t kc,
            const float *restrict a, const float *restrict b, const int64_t *o,
            const int64_t *restrict off, const int32_t *restrict sel, int64_t half, float *c,
            int64_t ldc, float beta, const mdl_epilogue *ep, int64_t row0)
{
    __m512 c0_0 = _mm512_setzero_ps(), c0_1 = c0_0, c0_2 = c0_0, c1_0 = c0_0, c1_1 = c0_0;
    __m512 c1_2 = c0_0, c2_0 = c0_0, c2_1 = c0_0, c2_2 = c0_0, c3_0 = c0_0, c3_1 = c0_0;
    __m512 c3_2 = c0_0, c4_0 = c0_0, c4_1 = c0_0, c4_2 = c0_0, c5_0 = c0_0, c5_1 = c0_0;
    __m512 c5_2 = c0_0, c6_0 = c0_0, c6_1 = c0_0, c6_2 = c0_0, c7_0 = c0_0, c7_1 = c0_0;
    __m512 c7_2 = c0_0;
    const float *b0p = b + o[0], *b1p = b + o[NV > 1 ? 1 : 0], *b2p = b + o[NV > 2 ? 2 : 0];
    const int64_t h = CONTIGUOUS ? 8 : half;
#pragma GCC unroll 2
    for (int64_t i = 0; i < kc; i++) {
        const int64_t p = SEL ? sel[i] : i, q = off[p];
        const __m512 b0 = pixels16(b0p + q, h);
        __m512 b1 = b0, b2 = b0;
        if (NV > 1) b1 = pixels16(b1p + q, h);
        if (NV > 2) b2 = pixels16(b2p + q, h);
        R8(RFMA)
    }
    const __m512 vb = _mm512_set1_ps(beta);
    R8(RFINISH)
}

static void rows_tile(int rows, int nv, int64_t kc, const float *a, const float *b,
                      const int64_t *o, const int64_t *off, const int32_t *sel, int64_t half,
                      float *c, int64_t ldc, float beta, const mdl_epilogue *ep, int64_t row0)
{
#define ROWS_NV(R, V)                                                                     \
    if (sel) rows_kernel(R, V, 1, 1, kc, a, b, o, off, sel, 8, c, ldc, beta, ep, row0);   \
    else if (half == 8)                                                                   \
        rows_kernel(R, V, 1, 0, kc, a, b, o, off, NULL, 8, c, ldc, beta, ep, row0);       \
    else rows_kernel(R, V, 0, 0, kc, a, b, o, off, NULL, half, c, ldc, beta, ep, row0);
#define ROWS_CASE(R)                                                                      \
    case R:                                                                               \
        if (nv == 3) { ROWS_NV(R, 3) } else if (nv == 2) { ROWS_NV(R, 2) } else { ROWS_NV(R, 1) } \
        break;
    switch (rows) {
    ROWS_CASE(8) ROWS_CASE(7) ROWS_CASE(6) ROWS_CASE(5) ROWS_CASE(4) ROWS_CASE(3) ROWS_CASE(2)
    default:
    ROWS_CASE(1)
    }
#undef ROWS_CASE
#undef ROWS_NV
}

/* The tiles of C (m x n) over K block pc's rows sel[0..kc) (local to the block; all
 * of them when sel is NULL) */
static void image_block(int64_t m, int64_t kb, const float *pa, const float *b, int64_t cols,
                        int64_t ld, int64_t n, const int64_t *off, const int32_t *sel,
                        int64_t kc, float beta, float *c, int64_t ldc, const mdl_epilogue *ep)
{
    const int64_t half = cols == 8 ? ld : 8;
    /* the 16-pixel panels in groups of RV or RV - 1 (4 panels: 2 + 2, not 3 + 1: a
     * tile of one vector does a load per FMA) */
    const int64_t np = ceil_div(n, 16), groups = ceil_div(np, RV);
    for (int64_t i = 0; i < m; i += RR)
        for (int64_t gi = 0; gi < groups; gi++) {
            const int64_t q0 = np * gi / groups, nv = np * (gi + 1) / groups - q0;
            int64_t o[RV];
            for (int v = 0; v < nv; v++) o[v] = mdl_rows_panel(16 * (q0 + v), cols, ld);
            rows_tile((int)min64(m - i, RR), (int)nv, kc, pa + i * kb, b, o, off, sel, half,
                      c + i * ldc + 16 * q0, ldc, beta, ep, i);
        }
}

void mdl_sgemm_avx512_packed_image(int64_t m, int64_t k, const float *pa, const float *b,
                                   int64_t cols, int64_t ld, int64_t n, const int64_t *off,
                                   float beta, float *c, int64_t ldc, const mdl_epilogue *ep)
{
    const int64_t kc = k_block(k), mp = round_up(m, RR);
    for (int64_t pc = 0; pc < k; pc += kc) {
        const int64_t kb = min64(k - pc, kc);
        image_block(m, kb, pa + pc * mp, b, cols, ld, n, off + pc, NULL, kb,
                    pc == 0 ? beta : 1.0f, c, ldc, pc + kb == k ? ep : NULL);
    }
}

void mdl_sgemm_avx512_packed_image_sel(int64_t m, int64_t k, const float *pa, const float *b,
                                       int64_t cols, int64_t ld, int64_t n, const int64_t *off,
                                       const int32_t *sel, int64_t nsel, float *c, int64_t ldc)
{
    const int64_t kc = k_block(k), mp = round_up(m, RR);
    int32_t local[KC_MAX];
    int first = 1;
    for (int64_t pc = 0, e = 0; pc < k; pc += kc) {
        const int64_t kb = min64(k - pc, kc);
        int64_t cnt = 0;
        for (; e < nsel && sel[e] < pc + kb; e++) local[cnt++] = (int32_t)(sel[e] - pc);
        if (!cnt) continue;
        image_block(m, kb, pa + pc * mp, b, cols, ld, n, off + pc, local, cnt,
                    first ? 0.0f : 1.0f, c, ldc, NULL);
        first = 0;
    }
}


#endif
