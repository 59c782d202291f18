/* winograd_avx2.c -- 3x3 and 5x5 convolutions with stride 1 by Winograd's minimal
 * filtering F(2x2, 3x3) and F(2x2, 5x5) (compiled with -mavx2 -mfma).
 *
 * Each 2x2 block of outputs ("tile") is computed from an a x a block of the
 * padded input d (a = r + 1 for an r x r filter g) as
 *     Y = A^T [ (G g G^T) (.) (B^T d B) ] A
 * with a^2 multiplications instead of 4 r^2 (16 for 36, 36 for 100).  Summed
 * over the input channels, the elementwise product (.) becomes a^2 independent
 * GEMMs, one per position xi of the transform:
 *     M_xi (c_out, T) = U_xi (c_out, c_in) @ V_xi (c_in, T),   T tiles per image.
 * So a convolution is: transform the weights once per call (U, packed for the
 * GEMM micro-kernel), and per image transform the input (V), run the GEMMs, and
 * transform M back into y, where the epilogue (bias, ReLU, channel sums) is
 * applied.
 *
 * The transforms run 8 tiles at a time along a tile row: the input's row
 * combination (B^T from the left) is a vector operation over whole padded rows,
 * and the column combination (B from the right) needs the even and odd columns
 * of those rows, split once per row (tiles step by 2 columns).  The output
 * transform writes two output rows per tile row, interleaving the tiles' two
 * columns.  The matrices come from the Toom-Cook construction with the points
 * 0, 1, -1 (r = 3) or 0, 1, -1, 2, -2 (r = 5), and infinity; the coefficient
 * tables are compile-time constants, so the unrolled loops keep only the
 * non-zero terms. */
#include "common.h"
#if MDL_X86
#include <string.h>
#include <immintrin.h>
#include "simd_avx2.h"
#include "conv.h"
#include "gemm.h"

#define FL(n) (((size_t)(n) + 15) & ~(size_t)15) /* floats, rounded up to 64 bytes */
#define AMAX 6                                      /* the largest a = r + 1 */

static const float BT3[AMAX][AMAX] = {{1, 0, -1, 0}, {0, 1, 1, 0}, {0, -1, 1, 0}, {0, 1, 0, -1}};
static const float G3[AMAX][5] = {{1, 0, 0}, {0.5f, 0.5f, 0.5f}, {0.5f, -0.5f, 0.5f}, {0, 0, 1}};
static const float AT3[2][AMAX] = {{1, 1, 1, 0}, {0, 1, -1, -1}};

static const float BT5[AMAX][AMAX] = {
    {4, 0, -5, 0, 1, 0}, {0, -4, -4, 1, 1, 0}, {0, 4, -4, -1, 1, 0},
    {0, -2, -1, 2, 1, 0}, {0, 2, -1, -2, 1, 0}, {0, 4, 0, -5, 0, 1}};
static const float G5[AMAX][5] = {
    {1.0f / 4, 0, 0, 0, 0},
    {-1.0f / 6, -1.0f / 6, -1.0f / 6, -1.0f / 6, -1.0f / 6},
    {-1.0f / 6, 1.0f / 6, -1.0f / 6, 1.0f / 6, -1.0f / 6},
    {1.0f / 24, 1.0f / 12, 1.0f / 6, 1.0f / 3, 2.0f / 3},
    {1.0f / 24, -1.0f / 12, 1.0f / 6, -1.0f / 3, 2.0f / 3},
    {0, 0, 0, 0, 1}};
static const float AT5[2][AMAX] = {{1, 1, 1, 1, 1, 0}, {0, 1, -1, 2, -2, 1}};

typedef struct wino_geom {
    int r, a;            /* filter size, transform size a = r + 1 */
    int64_t th, tw, T;   /* tile rows, tile columns, tiles */
    int64_t lp;          /* floats of a padded input row (2 * tw + a - 2 used) */
    int64_t le;          /* floats of an even / odd column array (tw + a / 2 - 1 used) */
} wino_geom;

static wino_geom geom(const mdl_conv2d_shape *s, int64_t ho, int64_t wo)
{
    wino_geom g;
    g.r = (int)s->kh;
    g.a = g.r + 1;
    g.th = (ho + 1) / 2;
    g.tw = (wo + 1) / 2;
    g.T = g.th * g.tw;
    const int64_t e = (g.tw + g.a / 2 + 7) / 8 * 8; /* even / odd elements split, in vectors */
    g.lp = FL(2 * e + 16);
    g.le = FL(e + 8);
    return g;
}

int mdl_winograd_applies(const mdl_conv2d_shape *s)
{
    return (s->kh == 3 || s->kh == 5) && s->kw == s->kh && s->stride_h == 1 &&
           s->stride_w == 1 && s->pad_h <= s->kh - 1 && s->pad_w <= s->kw - 1;
}

size_t mdl_winograd_fixed_floats(const mdl_conv2d_shape *s)
{
    /* the a^2 packed U_xi, then U unpacked (xi, c_out, c_in) while packing */
    const int64_t aa = (s->kh + 1) * (s->kh + 1);
    return aa * FL(mdl_sgemm_avx2_packed_a_floats(s->c_out, s->c_in)) + FL(aa * s->c_out * s->c_in);
}

size_t mdl_winograd_thread_floats(const mdl_conv2d_shape *s, int64_t ho, int64_t wo)
{
    wino_geom g = geom(s, ho, wo);
    const int64_t aa = g.a * g.a;
    /* V, M, a packed B panel, a padded rows, 2a even / odd arrays */
    return FL(aa * s->c_in * g.T) + FL(aa * s->c_out * g.T) +
           FL(mdl_sgemm_avx2_packed_b_floats(s->c_in)) + g.a * (size_t)g.lp +
           2 * g.a * (size_t)g.le;
}

/* U_xi = (G g G^T)[xi] for every (co, ci), packed as the A operands of the GEMMs */
void mdl_winograd_weights(const mdl_conv2d_shape *s, const float *w, float *fixed)
{
    const int r = (int)s->kh, a = r + 1;
    const float (*G)[5] = r == 3 ? G3 : G5;
    const int64_t c_out = s->c_out, c_in = s->c_in;
    const int64_t pa = FL(mdl_sgemm_avx2_packed_a_floats(c_out, c_in));
    float *u = fixed + a * a * pa;
    for (int64_t co = 0; co < c_out; co++)
        for (int64_t ci = 0; ci < c_in; ci++) {
            const float *g = w + (co * c_in + ci) * r * r;
            float t[AMAX][5]; /* G g */
            for (int i = 0; i < a; i++)
                for (int j = 0; j < r; j++) {
                    float acc = 0.0f;
                    for (int k = 0; k < r; k++) acc += G[i][k] * g[k * r + j];
                    t[i][j] = acc;
                }
            for (int i = 0; i < a; i++) /* (G g) G^T */
                for (int j = 0; j < a; j++) {
                    float acc = 0.0f;
                    for (int k = 0; k < r; k++) acc += t[i][k] * G[j][k];
                    u[((i * a + j) * c_out + co) * c_in + ci] = acc;
                }
        }
    for (int xi = 0; xi < a * a; xi++)
        mdl_sgemm_avx2_pack_a(0, c_out, c_in, 1.0f, u + xi * c_out * c_in, c_in, fixed + xi * pa);
}

/* dst[0, lp) = the input row ih of a channel plane, shifted right by pad_w and
 * zero outside the plane (all zero when ih is outside) */
static void padded_row(const float *plane, int64_t h, int64_t w, int64_t ih, int64_t pad_w,
                       int64_t lp, float *dst)
{
    memset(dst, 0, (size_t)lp * sizeof(float));
    if (ih < 0 || ih >= h) return;
    int64_t n = w < lp - pad_w ? w : lp - pad_w;
    memcpy(dst + pad_w, plane + ih * w, (size_t)n * sizeof(float));
}

/* even[k] = t[2k], odd[k] = t[2k + 1] for k < count (t has 2 * count + 8 floats) */
static void split_even_odd(const float *t, int64_t count, float *even, float *odd)
{
    for (int64_t k = 0; k < count; k += 8) {
        __m256 a = _mm256_loadu_ps(t + 2 * k), b = _mm256_loadu_ps(t + 2 * k + 8);
        _mm256_storeu_ps(even + k, mdl_even_lanes(a, b));
        /* the odd elements: shift by one float and take the even ones */
        __m256 a1 = _mm256_loadu_ps(t + 2 * k + 1), b1 = _mm256_loadu_ps(t + 2 * k + 9);
        _mm256_storeu_ps(odd + k, mdl_even_lanes(a1, b1));
    }
}

static inline void store_tiles(float *dst, int64_t left, __m256 v)
{
    if (left >= 8)
        _mm256_storeu_ps(dst, v);
    else
        mdl_store_first8(dst, v, left);
}

static inline __m256 load_tiles(const float *src, int64_t left)
{
    return left >= 8 ? _mm256_loadu_ps(src) : _mm256_maskload_ps(src, mdl_lane_mask(0, left));
}

/* sum over l < A of bt[l] * v[l], the terms with a zero coefficient left out
 * (bt and A are compile-time constants where this is inlined) */
static inline __attribute__((always_inline)) __m256 combine(const int A, const float *bt,
                                                            const __m256 *v)
{
    __m256 acc = _mm256_setzero_ps();
#pragma GCC unroll 6
    for (int l = 0; l < A; l++) {
        if (bt[l] == 1.0f)
            acc = _mm256_add_ps(acc, v[l]);
        else if (bt[l] == -1.0f)
            acc = _mm256_sub_ps(acc, v[l]);
        else if (bt[l] != 0.0f)
            acc = _mm256_fmadd_ps(_mm256_set1_ps(bt[l]), v[l], acc);
    }
    return acc;
}

/* V_xi[ci][tile] = (B^T d B)[xi] for every input channel and tile of one image */
static inline __attribute__((always_inline)) void
input_transform(const int R, const mdl_conv2d_shape *s, const wino_geom *g, const float *x,
                float *v, float *rows, float *eo)
{
    const int A = R + 1;
    const float (*BT)[AMAX] = R == 3 ? BT3 : BT5;
    const int64_t c_in = s->c_in, h = s->h, w = s->w, T = g->T, lp = g->lp, le = g->le;
    for (int64_t ci = 0; ci < c_in; ci++) {
        const float *plane = x + ci * h * w;
        for (int64_t th = 0; th < g->th; th++) {
            for (int l = 0; l < A; l++)
                padded_row(plane, h, w, 2 * th - s->pad_h + l, s->pad_w, lp, rows + l * lp);
            /* the rows of B^T d, then their even and odd columns */
            for (int64_t c = 0; c < lp; c += 8) {
                __m256 in[AMAX], t[AMAX];
                for (int l = 0; l < A; l++) in[l] = _mm256_load_ps(rows + l * lp + c);
                for (int i = 0; i < A; i++) t[i] = combine(A, BT[i], in);
                for (int i = 0; i < A; i++) _mm256_store_ps(rows + i * lp + c, t[i]);
            }
            for (int i = 0; i < A; i++)
                split_even_odd(rows + i * lp, lp / 2 - 8, eo + 2 * i * le, eo + (2 * i + 1) * le);
            /* the columns: tile tw reads columns 2 tw + j, even ones from E, odd from O */
            float *vrow = v + ci * T + th * g->tw;
            for (int64_t k = 0; k < g->tw; k += 8) {
                const int64_t left = g->tw - k;
                for (int i = 0; i < A; i++) {
                    const float *e = eo + 2 * i * le + k, *o = eo + (2 * i + 1) * le + k;
                    __m256 col[AMAX];
                    for (int j = 0; j < A; j++)
                        col[j] = _mm256_loadu_ps((j % 2 ? o : e) + j / 2);
                    for (int j = 0; j < A; j++)
                        store_tiles(vrow + (i * A + j) * c_in * T + k, left,
                                    combine(A, BT[j], col));
                }
            }
        }
    }
}

/* y (c_out, ho, wo) of one image = A^T M A per tile, then the epilogue */
static inline __attribute__((always_inline)) void
output_transform(const int R, const mdl_conv2d_shape *s, const wino_geom *g, int64_t ho,
                 int64_t wo, const float *m, const mdl_epilogue *ep, float *y)
{
    const int A = R + 1;
    const float (*AT)[AMAX] = R == 3 ? AT3 : AT5;
    const int64_t c_out = s->c_out, T = g->T;
    const __m256 zero = _mm256_setzero_ps();
    for (int64_t co = 0; co < c_out; co++) {
        const __m256 bias = _mm256_set1_ps(ep && ep->bias ? ep->bias[co] : 0.0f);
        __m256d sum = _mm256_setzero_pd(), sumsq = sum;
        for (int64_t th = 0; th < g->th; th++) {
            for (int64_t k = 0; k < g->tw; k += 8) {
                const int64_t left = g->tw - k;
                const float *mp = m + co * T + th * g->tw + k;
                __m256 mm[AMAX * AMAX];
                for (int xi = 0; xi < A * A; xi++) mm[xi] = load_tiles(mp + xi * c_out * T, left);
                for (int i = 0; i < 2; i++) {
                    const int64_t oh = 2 * th + i;
                    if (oh >= ho) break;
                    __m256 sb[AMAX]; /* (A^T M)[i][b] */
                    for (int b = 0; b < A; b++) {
                        __m256 colm[AMAX];
                        for (int q = 0; q < A; q++) colm[q] = mm[q * A + b];
                        sb[b] = combine(A, AT[i], colm);
                    }
                    __m256 y0 = combine(A, AT[0], sb), y1 = combine(A, AT[1], sb);
                    /* interleave the tiles' two columns: outputs 2k .. 2k + 15 of the row */
                    __m256 lo = _mm256_unpacklo_ps(y0, y1), hi = _mm256_unpackhi_ps(y0, y1);
                    __m256 out[2] = {_mm256_permute2f128_ps(lo, hi, 0x20),
                                     _mm256_permute2f128_ps(lo, hi, 0x31)};
                    float *yr = y + (co * ho + oh) * wo + 2 * k;
                    for (int q = 0; q < 2; q++) {
                        const int64_t cols = wo - 2 * k - 8 * q; /* outputs left in this row */
                        if (cols <= 0) break;
                        __m256 o = _mm256_add_ps(out[q], bias);
                        if (ep && ep->relu) o = _mm256_max_ps(zero, o); /* NaN passes */
                        if (cols >= 8) {
                            _mm256_storeu_ps(yr + 8 * q, o);
                        } else {
                            const __m256i mk = mdl_lane_mask(0, cols);
                            o = _mm256_and_ps(o, _mm256_castsi256_ps(mk));
                            mdl_store_first8(yr + 8 * q, o, cols);
                        }
                        if (ep && ep->row_sum) {
                            __m256d l = _mm256_cvtps_pd(_mm256_castps256_ps128(o));
                            __m256d u = _mm256_cvtps_pd(_mm256_extractf128_ps(o, 1));
                            sum = _mm256_add_pd(sum, _mm256_add_pd(l, u));
                            sumsq = _mm256_fmadd_pd(l, l, _mm256_fmadd_pd(u, u, sumsq));
                        }
                    }
                }
            }
        }
        if (ep && ep->row_sum) {
            ep->row_sum[co] += mdl_hsum_pd(sum);
            ep->row_sumsq[co] += mdl_hsum_pd(sumsq);
        }
    }
}

static inline __attribute__((always_inline)) void
image(const int R, const mdl_conv2d_shape *s, int64_t ho, int64_t wo, const float *fixed,
      const float *x, const mdl_epilogue *ep, float *y, float *buf)
{
    const wino_geom g = geom(s, ho, wo);
    const int64_t c_in = s->c_in, c_out = s->c_out, T = g.T, aa = g.a * g.a;
    const int64_t pa = FL(mdl_sgemm_avx2_packed_a_floats(c_out, c_in));
    float *v = buf, *m = v + FL(aa * c_in * T), *bbuf = m + FL(aa * c_out * T);
    float *rows = bbuf + FL(mdl_sgemm_avx2_packed_b_floats(c_in)), *eo = rows + g.a * g.lp;
    input_transform(R, s, &g, x, v, rows, eo);
    for (int64_t xi = 0; xi < aa; xi++)
        mdl_sgemm_avx2_packed(0, c_out, T, c_in, fixed + xi * pa, v + xi * c_in * T, T, 0.0f,
                              m + xi * c_out * T, T, NULL, bbuf);
    output_transform(R, s, &g, ho, wo, m, ep, y);
}

void mdl_winograd_image(const mdl_conv2d_shape *s, int64_t ho, int64_t wo, const float *fixed,
                        const float *x, const mdl_epilogue *ep, float *y, float *buf)
{
    if (s->kh == 3)
        image(3, s, ho, wo, fixed, x, ep, y, buf);
    else
        image(5, s, ho, wo, fixed, x, ep, y, buf);
}
#endif
