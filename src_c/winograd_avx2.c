/* winograd_avx2.c -- 3x3 convolution with stride 1 by Winograd's minimal filtering
 * F(2x2, 3x3) (compiled with -mavx2 -mfma).
 *
 * Each 2x2 block of outputs ("tile") is computed from a 4x4 block of the padded
 * input d and a 3x3 filter g as
 *     Y = A^T [ (G g G^T) (.) (B^T d B) ] A
 * with 16 multiplications instead of 36.  Summed over the input channels, the
 * elementwise product (.) becomes 16 independent GEMMs, one per position xi of
 * the 4x4 transform:  M_xi (c_out, T) = U_xi (c_out, c_in) @ V_xi (c_in, T),
 * T the number of tiles of an image.  So a convolution is: transform the weights
 * once per call (U, packed for the GEMM micro-kernel), and per image transform
 * the input (V), run the 16 GEMMs, and transform M back into y, where the
 * epilogue (bias, ReLU, channel sums) is applied.
 *
 * The transforms run 8 tiles at a time along a tile row: the input's row
 * combination (B^T from the left) is a vector operation over whole padded rows,
 * and the column combination (B from the right) needs the even and odd columns
 * of those rows, split once per row.  The output transform writes two output
 * rows per tile row, interleaving the tiles' two columns.
 *     B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1]
 *     G   = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1]
 *     A^T = [1 1 1 0; 0 1 -1 -1] */
#include "common.h"
#if MDL_X86
#include <string.h>
#include <immintrin.h>
#include "simd_avx2.h"
#include "conv.h"
#include "gemm.h"

#define FL(n) (((size_t)(n) + 15) & ~(size_t)15) /* floats, rounded up to 64 bytes */

typedef struct wino_geom {
    int64_t th, tw, T;   /* tile rows, tile columns, tiles */
    int64_t lp;          /* floats of a padded input row (2 * tw + 2 used) */
    int64_t le;          /* floats of an even / odd column array (tw + 1 used) */
} wino_geom;

static wino_geom geom(const mdl_conv2d_shape *s, int64_t ho, int64_t wo)
{
    wino_geom g;
    g.th = (ho + 1) / 2;
    g.tw = (wo + 1) / 2;
    g.T = g.th * g.tw;
    const int64_t e = (g.tw + 1 + 7) / 8 * 8; /* even / odd elements split, in vectors of 8 */
    g.lp = FL(2 * e + 16);
    g.le = FL(e + 8);
    (void)s;
    return g;
}

int mdl_winograd_applies(const mdl_conv2d_shape *s)
{
    return s->kh == 3 && s->kw == 3 && s->stride_h == 1 && s->stride_w == 1 && s->pad_h <= 2 &&
           s->pad_w <= 2;
}

size_t mdl_winograd_fixed_floats(const mdl_conv2d_shape *s)
{
    /* the 16 packed U_xi, then U unpacked (xi, c_out, c_in) while packing */
    return 16 * FL(mdl_sgemm_avx2_packed_a_floats(s->c_out, s->c_in)) +
           FL(16 * s->c_out * s->c_in);
}

size_t mdl_winograd_thread_floats(const mdl_conv2d_shape *s, int64_t ho, int64_t wo)
{
    wino_geom g = geom(s, ho, wo);
    /* V, M, a packed B panel, 4 padded rows, 8 even / odd arrays */
    return FL(16 * s->c_in * g.T) + FL(16 * s->c_out * g.T) +
           FL(mdl_sgemm_avx2_packed_b_floats(s->c_in)) + 4 * (size_t)g.lp + 8 * (size_t)g.le;
}

/* U_xi = (G g G^T)[xi] for every (co, ci), packed as the A operands of the GEMMs */
void mdl_winograd_weights(const mdl_conv2d_shape *s, const float *w, float *fixed)
{
    const int64_t c_out = s->c_out, c_in = s->c_in, pa = FL(mdl_sgemm_avx2_packed_a_floats(c_out, c_in));
    float *u = fixed + 16 * pa;
    for (int64_t co = 0; co < c_out; co++)
        for (int64_t ci = 0; ci < c_in; ci++) {
            const float *g = w + (co * c_in + ci) * 9;
            float t[4][3]; /* G g */
            for (int j = 0; j < 3; j++) {
                t[0][j] = g[j];
                t[1][j] = 0.5f * (g[j] + g[3 + j] + g[6 + j]);
                t[2][j] = 0.5f * (g[j] - g[3 + j] + g[6 + j]);
                t[3][j] = g[6 + j];
            }
            for (int a = 0; a < 4; a++) { /* (G g) G^T */
                float r[4] = {t[a][0], 0.5f * (t[a][0] + t[a][1] + t[a][2]),
                              0.5f * (t[a][0] - t[a][1] + t[a][2]), t[a][2]};
                for (int b = 0; b < 4; b++) u[((a * 4 + b) * c_out + co) * c_in + ci] = r[b];
            }
        }
    for (int xi = 0; xi < 16; xi++)
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
        _mm256_maskstore_ps(dst, mdl_lane_mask(0, left), v);
}

static inline __m256 load_tiles(const float *src, int64_t left)
{
    return left >= 8 ? _mm256_loadu_ps(src) : _mm256_maskload_ps(src, mdl_lane_mask(0, left));
}

/* V_xi[ci][tile] = (B^T d B)[xi] for every input channel and tile of one image */
static void input_transform(const mdl_conv2d_shape *s, const wino_geom *g, const float *x,
                            float *v, float *rows, float *eo)
{
    const int64_t c_in = s->c_in, h = s->h, w = s->w, T = g->T, lp = g->lp, le = g->le;
    float *r[4] = {rows, rows + lp, rows + 2 * lp, rows + 3 * lp};
    for (int64_t ci = 0; ci < c_in; ci++) {
        const float *plane = x + ci * h * w;
        for (int64_t th = 0; th < g->th; th++) {
            for (int a = 0; a < 4; a++)
                padded_row(plane, h, w, 2 * th - s->pad_h + a, s->pad_w, lp, r[a]);
            /* rows of B^T d, in place: t0 = r0 - r2, t1 = r1 + r2, t2 = r2 - r1, t3 = r1 - r3 */
            for (int64_t c = 0; c < lp; c += 8) {
                __m256 r0 = _mm256_load_ps(r[0] + c), r1 = _mm256_load_ps(r[1] + c);
                __m256 r2 = _mm256_load_ps(r[2] + c), r3 = _mm256_load_ps(r[3] + c);
                _mm256_store_ps(r[0] + c, _mm256_sub_ps(r0, r2));
                _mm256_store_ps(r[1] + c, _mm256_add_ps(r1, r2));
                _mm256_store_ps(r[2] + c, _mm256_sub_ps(r2, r1));
                _mm256_store_ps(r[3] + c, _mm256_sub_ps(r1, r3));
            }
            for (int a = 0; a < 4; a++) split_even_odd(r[a], g->tw + 1, eo + 2 * a * le,
                                                       eo + (2 * a + 1) * le);
            /* columns: (t B)[b] over the tiles tw: E = t[2tw], O = t[2tw+1], E1, O1 one tile on */
            float *vrow = v + ci * T + th * g->tw;
            for (int64_t k = 0; k < g->tw; k += 8) {
                const int64_t left = g->tw - k;
                for (int a = 0; a < 4; a++) {
                    const float *e = eo + 2 * a * le + k, *o = eo + (2 * a + 1) * le + k;
                    __m256 E = _mm256_loadu_ps(e), O = _mm256_loadu_ps(o);
                    __m256 E1 = _mm256_loadu_ps(e + 1), O1 = _mm256_loadu_ps(o + 1);
                    float *d = vrow + (a * 4) * c_in * T + k;
                    store_tiles(d, left, _mm256_sub_ps(E, E1));
                    store_tiles(d + c_in * T, left, _mm256_add_ps(O, E1));
                    store_tiles(d + 2 * c_in * T, left, _mm256_sub_ps(E1, O));
                    store_tiles(d + 3 * c_in * T, left, _mm256_sub_ps(O, O1));
                }
            }
        }
    }
}

/* y (c_out, ho, wo) of one image = A^T M A per tile, then the epilogue */
static void output_transform(const mdl_conv2d_shape *s, const wino_geom *g, int64_t ho,
                             int64_t wo, const float *m, const mdl_epilogue *ep, float *y)
{
    const int64_t c_out = s->c_out, T = g->T;
    const __m256 zero = _mm256_setzero_ps();
    for (int64_t co = 0; co < c_out; co++) {
        const __m256 bias = _mm256_set1_ps(ep && ep->bias ? ep->bias[co] : 0.0f);
        __m256d sum = _mm256_setzero_pd(), sumsq = sum;
        for (int64_t th = 0; th < g->th; th++) {
            for (int64_t k = 0; k < g->tw; k += 8) {
                const int64_t left = g->tw - k;
                const float *mp = m + co * T + th * g->tw + k;
                __m256 mm[16];
                for (int xi = 0; xi < 16; xi++) mm[xi] = load_tiles(mp + xi * c_out * T, left);
                for (int i = 0; i < 2; i++) {
                    const int64_t oh = 2 * th + i;
                    if (oh >= ho) break;
                    __m256 sb[4]; /* (A^T M)[i][b] */
                    for (int b = 0; b < 4; b++)
                        sb[b] = i == 0 ? _mm256_add_ps(_mm256_add_ps(mm[b], mm[4 + b]), mm[8 + b])
                                       : _mm256_sub_ps(_mm256_sub_ps(mm[4 + b], mm[8 + b]),
                                                       mm[12 + b]);
                    __m256 y0 = _mm256_add_ps(_mm256_add_ps(sb[0], sb[1]), sb[2]);
                    __m256 y1 = _mm256_sub_ps(_mm256_sub_ps(sb[1], sb[2]), sb[3]);
                    /* interleave the tiles' two columns: outputs 2k .. 2k + 15 of the row */
                    __m256 lo = _mm256_unpacklo_ps(y0, y1), hi = _mm256_unpackhi_ps(y0, y1);
                    __m256 out[2] = {_mm256_permute2f128_ps(lo, hi, 0x20),
                                     _mm256_permute2f128_ps(lo, hi, 0x31)};
                    float *yr = y + (co * ho + oh) * wo + 2 * k;
                    for (int q = 0; q < 2; q++) {
                        const int64_t cols = wo - 2 * k - 8 * q; /* outputs left in this row */
                        if (cols <= 0) break;
                        __m256 o = _mm256_add_ps(out[q], bias);
                        if (ep && ep->relu) o = _mm256_max_ps(o, zero);
                        if (cols >= 8) {
                            _mm256_storeu_ps(yr + 8 * q, o);
                        } else {
                            const __m256i mk = mdl_lane_mask(0, cols);
                            o = _mm256_and_ps(o, _mm256_castsi256_ps(mk));
                            _mm256_maskstore_ps(yr + 8 * q, mk, o);
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

void mdl_winograd_image(const mdl_conv2d_shape *s, int64_t ho, int64_t wo, const float *fixed,
                        const float *x, const mdl_epilogue *ep, float *y, float *buf)
{
    const wino_geom g = geom(s, ho, wo);
    const int64_t c_in = s->c_in, c_out = s->c_out, T = g.T;
    const int64_t pa = FL(mdl_sgemm_avx2_packed_a_floats(c_out, c_in));
    float *v = buf, *m = v + FL(16 * c_in * T), *bbuf = m + FL(16 * c_out * T);
    float *rows = bbuf + FL(mdl_sgemm_avx2_packed_b_floats(c_in)), *eo = rows + 4 * g.lp;
    input_transform(s, &g, x, v, rows, eo);
    for (int xi = 0; xi < 16; xi++)
        mdl_sgemm_avx2_packed(0, c_out, T, c_in, fixed + xi * pa, v + xi * c_in * T, T, 0.0f,
                              m + xi * c_out * T, T, NULL, bbuf);
    output_transform(s, &g, ho, wo, m, ep, y);
}
#endif
