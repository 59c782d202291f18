/* conv_avx2.c -- AVX2 pieces of the im2col convolution; compiled with -mavx2 -mfma.
 * Row tails use masked loads and stores, or the scalar loop. */
#include "common.h"
#if MDL_X86
#include <string.h>
#include <immintrin.h>
#include "simd_avx2.h"
#include "act.h"
#include "conv.h"

/* d[0, count) = 0 */
static inline void zero_row(float *d, int64_t count)
{
    const __m256 z = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= count; i += 8) _mm256_storeu_ps(d + i, z);
    if (i < count) mdl_store_first8(d + i, z, count - i);
}

/* d[0, n) = src[k] for k in [lo, hi), 0 elsewhere; src is read only in [lo, hi).
 * Masked loads give the zeros, so short rows cost one load and one store per 8. */
static inline void window_row(float *d, const float *src, int64_t n, int64_t lo, int64_t hi)
{
    int64_t k = 0;
    for (; k + 8 <= n; k += 8) {
        if (k >= lo && k + 8 <= hi)
            _mm256_storeu_ps(d + k, _mm256_loadu_ps(src + k));
        else
            _mm256_storeu_ps(d + k, _mm256_maskload_ps(src + k, mdl_lane_mask(lo - k, hi - k)));
    }
    if (k < n) {
        mdl_store_first8(d + k, _mm256_maskload_ps(src + k, mdl_lane_mask(lo - k, hi - k)), n - k);
    }
}

/* d[k] = src[2k] for k in [0, count); reads only src[0, 2*count - 1) */
static inline void gather2_row(float *d, const float *src, int64_t count)
{
    int64_t k = 0;
    for (; k + 9 <= count; k += 8)
        _mm256_storeu_ps(d + k, mdl_even_lanes(_mm256_loadu_ps(src + 2 * k),
                                           _mm256_loadu_ps(src + 2 * k + 8)));
    for (; k < count; k++) d[k] = src[2 * k];
}

void mdl_conv_im2col_avx2(const mdl_conv2d_shape *s, int64_t ho, int64_t wo, const float *x,
                          float *col, int64_t ld, int64_t r0, int64_t r1)
{
    const int64_t h = s->h, w = s->w, kh = s->kh, kw = s->kw, sw = s->stride_w;
    if (r0 >= r1) return;
    /* the valid output rows of each kernel row i and columns of each kernel column j,
     * once per call (a row of the column matrix of a 4x4 image is 16 floats: the
     * divisions of mdl_conv_valid_range per row cost as much as the copy) */
    int64_t oh_lo[kh], oh_hi[kh], ow_lo[kw], ow_hi[kw];
    for (int64_t i = 0; i < kh; i++)
        mdl_conv_valid_range(h, ho, s->stride_h, s->pad_h, i, &oh_lo[i], &oh_hi[i]);
    for (int64_t j = 0; j < kw; j++)
        mdl_conv_valid_range(w, wo, sw, s->pad_w, j, &ow_lo[j], &ow_hi[j]);
    int64_t ci = r0 / (kh * kw), i = r0 / kw % kh, j = r0 % kw;
    for (int64_t r = r0; r < r1; r++) {
        float *dst = col + (r - r0) * ld;
        const int64_t oh0 = oh_lo[i], oh1 = oh_hi[i], ow0 = ow_lo[j], ow1 = ow_hi[j];
        zero_row(dst, oh0 * wo);
        for (int64_t oh = oh0; oh < oh1; oh++) {
            float *d = dst + oh * wo;
            const float *src = x + (ci * h + oh * s->stride_h - s->pad_h + i) * w - s->pad_w + j;
            if (sw == 1) {
                window_row(d, src, wo, ow0, ow1);
                continue;
            }
            zero_row(d, ow0);
            if (sw == 2) {
                gather2_row(d + ow0, src + 2 * ow0, ow1 - ow0);
            } else {
                for (int64_t ow = ow0; ow < ow1; ow++) d[ow] = src[ow * sw];
            }
            zero_row(d + ow1, wo - ow1);
        }
        zero_row(dst + oh1 * wo, (ho - oh1) * wo);
        if (++j == kw) {
            j = 0;
            if (++i == kh) i = 0, ci++;
        }
    }
}

/* d[0, n) = src[0, n), inline: the rows here are short, and a libc call per row cost
 * more than the copy (bench/NOTES.md) */
static inline void copy_row(float *d, const float *src, int64_t n)
{
    int64_t k = 0;
    for (; k + 8 <= n; k += 8) _mm256_storeu_ps(d + k, _mm256_loadu_ps(src + k));
    if (k < n) {
        mdl_store_first8(d + k, _mm256_maskload_ps(src + k, mdl_lane_mask(0, n - k)), n - k);
    }
}

/* d[0, w) = src[0, w) read through the map g (a copy when there is no map) */
static inline void affine_row(float *d, const float *src, int64_t w, int mapped, mdl_affine_ch g)
{
    if (mapped)
        mdl_affine_row8(src, w, g, d);
    else
        copy_row(d, src, w);
}

/* R rows' sums side by side, each row's 8-vectors shifted by the mean of its first 8
 * values, k, in float over 128 columns at a time (mdl_add_shifted_sums), the values after
 * the last whole vector in double: each row's own chain of adds is the same as alone,
 * but one chain waits on the add's latency for every vector, R of them keep the adder
 * busy */
static inline __attribute__((always_inline)) void
row_sums(const int R, int64_t P, const float *y, double *sum, double *sumsq)
{
    double s[4] = {0.0}, q[4] = {0.0};
    __m256 k[4];
    for (int i = 0; i < R; i++)
        k[i] = _mm256_set1_ps(P < 8 ? 0.0f : mdl_hsum_ps(_mm256_loadu_ps(y + i * P)) / 8.0f);
    for (int64_t j0 = 0; j0 < P; j0 += 128) {
        const int64_t j1 = j0 + 128 < P ? j0 + 128 : P;
        __m256 a[4], b[4];
        for (int i = 0; i < R; i++) a[i] = b[i] = _mm256_setzero_ps();
        int64_t j = j0;
        for (; j + 8 <= j1; j += 8)
            for (int i = 0; i < R; i++) {
                const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(y + i * P + j), k[i]);
                a[i] = _mm256_add_ps(a[i], d);
                b[i] = _mm256_fmadd_ps(d, d, b[i]);
            }
        for (int i = 0; i < R; i++) {
            if (j > j0)
                mdl_add_shifted_sums(_mm256_cvtss_f32(k[i]), (double)(j - j0),
                                     mdl_hsum_ps(a[i]), mdl_hsum_ps(b[i]), s + i, q + i);
            for (int64_t t = j; t < j1; t++) { /* the last few in double */
                const double v = y[i * P + t];
                s[i] += v;
                q[i] += v * v;
            }
        }
    }
    for (int i = 0; i < R; i++) {
        sum[i] += s[i];
        sumsq[i] += q[i];
    }
}

void mdl_conv_row_sums_avx2(int64_t rows, int64_t P, const float *y, double *sum, double *sumsq)
{
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4) row_sums(4, P, y + r * P, sum + r, sumsq + r);
    for (; r < rows; r++) row_sums(1, P, y + r * P, sum + r, sumsq + r);
}

void mdl_conv_affine_image_avx2(int64_t c, int64_t hw, const float *x, const mdl_affine *in,
                                float *tx)
{
    for (int64_t ch = 0; ch < c; ch++) mdl_affine_row8(x + ch * hw, hw, mdl_affine_at(in, ch), tx + ch * hw);
}

/* Stride 2: an input row's even and odd columns, 16 at a time, straight into the rows
 * of the planes that hold them (plane q's column c is input column 2c + q - pad_w:
 * the even columns go to plane pad_w % 2 from column pad_w / 2, the odd ones to the
 * other plane from column (pad_w + 1) / 2); columns past `cols`, and the odd ones when
 * there is one plane, are not stored.  d holds the nq planes' rows, `plane` apart. */
static inline __attribute__((always_inline)) void
split_row2(float *d, int64_t plane, int64_t nq, int64_t cols, const float *src, int64_t w,
           int64_t pad_w, int mapped, mdl_affine_ch g)
{
    const int64_t qe = pad_w % 2, qo = 1 - qe;
    float *de = qe < nq ? d + qe * plane + pad_w / 2 : NULL;
    float *dodd = qo < nq ? d + qo * plane + (pad_w + 1) / 2 : NULL;
    const int64_t ne_max = cols - pad_w / 2, no_max = cols - (pad_w + 1) / 2;
    const __m256 s = _mm256_set1_ps(g.s), t = _mm256_set1_ps(g.t);
    for (int64_t j = 0; j < w; j += 16) {
        __m256 a, b;
        if (j + 16 <= w) {
            a = _mm256_loadu_ps(src + j);
            b = _mm256_loadu_ps(src + j + 8);
        } else {
            a = _mm256_maskload_ps(src + j, mdl_lane_mask(0, w - j));
            b = _mm256_maskload_ps(src + j + 8, mdl_lane_mask(0, w - j - 8));
        }
        if (mapped) {
            a = mdl_relu8(_mm256_fmadd_ps(a, s, t), g.relu);
            b = mdl_relu8(_mm256_fmadd_ps(b, s, t), g.relu);
        }
        const int64_t c = j / 2, left = w - j; /* input columns left from j */
        if (de) {
            const int64_t n = (left + 1) / 2 < ne_max - c ? (left + 1) / 2 : ne_max - c;
            mdl_store_first8(de + c, mdl_even_lanes(a, b), n);
        }
        if (dodd) {
            const int64_t n = left / 2 < no_max - c ? left / 2 : no_max - c;
            mdl_store_first8(dodd + c, mdl_odd_lanes(a, b), n);
        }
    }
}

void mdl_conv_phase_image_avx2(const mdl_conv2d_shape *s, int64_t nr, int64_t nq, int64_t rows,
                               int64_t cols, const float *x, const mdl_affine *in, float *xp)
{
    const int64_t sh = s->stride_h, sw = s->stride_w, plane = rows * cols;
    /* stride 1: the rows copied into place; stride 2: split_row2; other strides element
     * by element */
    memset(xp, 0, (size_t)(s->c_in * nr * nq * plane) * sizeof(float)); /* the padding */
    for (int64_t ci = 0; ci < s->c_in; ci++) {
        const mdl_affine_ch g = mdl_affine_at(in, ci);
        for (int64_t r = 0; r < nr; r++)
            for (int64_t y = 0; y < rows; y++) {
                const int64_t ih = sh * y + r - s->pad_h;
                float *d = xp + (ci * nr + r) * nq * plane + y * cols; /* plane (r, 0) */
                if (ih < 0 || ih >= s->h) continue;
                const float *src = x + (ci * s->h + ih) * s->w;
                if (sw == 1) { /* the padded row */
                    affine_row(d + s->pad_w, src, s->w, in != NULL, g);
                    continue;
                }
                if (sw == 2) {
                    split_row2(d, plane, nq, cols, src, s->w, s->pad_w, in != NULL, g);
                    continue;
                }
                for (int64_t q = 0; q < nq; q++)
                    for (int64_t c = 0; c < cols; c++) {
                        const int64_t iw = sw * c + q - s->pad_w;
                        d[q * plane + c] = iw >= 0 && iw < s->w ? mdl_affine_apply(src[iw], g) : 0.0f;
                    }
            }
    }
}

void mdl_conv_interleave_row_avx2(int64_t sw, const float *const *src, int64_t w, float *d,
                                  int accumulate)
{
    int64_t x = 0;
    if (sw == 2) /* 16 columns from 8 of each source */
        for (; 2 * x + 16 <= w; x += 8) {
            const __m256 e = _mm256_loadu_ps(src[0] + x), o = _mm256_loadu_ps(src[1] + x);
            const __m256 lo = _mm256_unpacklo_ps(e, o), hi = _mm256_unpackhi_ps(e, o);
            __m256 v0 = _mm256_permute2f128_ps(lo, hi, 0x20), v1 = _mm256_permute2f128_ps(lo, hi, 0x31);
            if (accumulate) {
                v0 = _mm256_add_ps(v0, _mm256_loadu_ps(d + 2 * x));
                v1 = _mm256_add_ps(v1, _mm256_loadu_ps(d + 2 * x + 8));
            }
            _mm256_storeu_ps(d + 2 * x, v0);
            _mm256_storeu_ps(d + 2 * x + 8, v1);
        }
    for (int64_t c = sw * x; c < w; c++) {
        const float v = src[c % sw][c / sw];
        d[c] = accumulate ? d[c] + v : v;
    }
}

/* sum of p[0, count) */
float mdl_conv_sum_avx2(const float *p, int64_t count)
{
    return mdl_sum_ps(p, count);
}

/* dst[0, count) += src[0, count) */
static inline void add_row(float *dst, const float *src, int64_t count)
{
    int64_t i = 0;
    for (; i + 16 <= count; i += 16) {
        _mm256_storeu_ps(dst + i,
                         _mm256_add_ps(_mm256_loadu_ps(dst + i), _mm256_loadu_ps(src + i)));
        _mm256_storeu_ps(dst + i + 8,
                         _mm256_add_ps(_mm256_loadu_ps(dst + i + 8), _mm256_loadu_ps(src + i + 8)));
    }
    for (; i + 8 <= count; i += 8)
        _mm256_storeu_ps(dst + i,
                         _mm256_add_ps(_mm256_loadu_ps(dst + i), _mm256_loadu_ps(src + i)));
    if (i < count) {
        __m256i m = mdl_lane_mask(0, count - i);
        mdl_store_first8(dst + i, _mm256_add_ps(_mm256_maskload_ps(dst + i, m),
                                                _mm256_maskload_ps(src + i, m)), count - i);
    }
}

/* dst[2k] += src[k] for k in [0, count); touches only dst[0, 2*count - 1) (the odd
 * entries in between get + 0, which changes nothing: dx starts at +0) */
static inline void scatter2_add_row(float *dst, const float *src, int64_t count)
{
    const __m256 z = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 9 <= count; k += 8) {
        __m256 v = _mm256_loadu_ps(src + k);
        __m256 lo = _mm256_unpacklo_ps(v, z); /* v0 0 v1 0 | v4 0 v5 0 */
        __m256 hi = _mm256_unpackhi_ps(v, z); /* v2 0 v3 0 | v6 0 v7 0 */
        float *d = dst + 2 * k;
        _mm256_storeu_ps(d, _mm256_add_ps(_mm256_loadu_ps(d),
                                          _mm256_permute2f128_ps(lo, hi, 0x20)));
        _mm256_storeu_ps(d + 8, _mm256_add_ps(_mm256_loadu_ps(d + 8),
                                              _mm256_permute2f128_ps(lo, hi, 0x31)));
    }
    for (; k < count; k++) dst[2 * k] += src[k];
}

/* dx planes [c0, c1) = col2im(col): each col row (ci, i, j) is added back at
 * its kernel offset; vector loops for stride_w 1 and 2. */
void mdl_conv_col2im_avx2(const mdl_conv2d_shape *s, int64_t ho, int64_t wo, const float *col,
                          int64_t ld, float *dx, int64_t c0, int64_t c1, int accumulate)
{
    const int64_t h = s->h, w = s->w, kh = s->kh, kw = s->kw, sw = s->stride_w, sh = s->stride_h;
    for (int64_t ci = c0; ci < c1; ci++) {
        float *plane = dx + ci * h * w;
        if (!accumulate) memset(plane, 0, (size_t)(h * w) * sizeof(float));
        for (int64_t i = 0; i < kh; i++) {
            int64_t oh0, oh1;
            mdl_conv_valid_range(h, ho, sh, s->pad_h, i, &oh0, &oh1);
            for (int64_t j = 0; j < kw; j++) {
                const float *row = col + ((ci * kh + i) * kw + j) * ld;
                int64_t ow0, ow1;
                mdl_conv_valid_range(w, wo, sw, s->pad_w, j, &ow0, &ow1);
                if (ow0 == ow1) continue;
                for (int64_t oh = oh0; oh < oh1; oh++) {
                    float *d = plane + (oh * sh - s->pad_h + i) * w - s->pad_w + j;
                    const float *src = row + oh * wo;
                    if (sw == 1) {
                        add_row(d + ow0, src + ow0, ow1 - ow0);
                    } else if (sw == 2) {
                        scatter2_add_row(d + 2 * ow0, src + ow0, ow1 - ow0);
                    } else {
                        for (int64_t ow = ow0; ow < ow1; ow++) d[ow * sw] += src[ow];
                    }
                }
            }
        }
    }
}

/* a tile of 4 output channels x 3 rows k: 12 accumulators over 8 pixels at a time */
#define DOT_FMA(c)                                                          \
    {                                                                       \
        const __m256 d = _mm256_loadu_ps(dy + (co + c) * P + q);            \
        a##c##0 = _mm256_fmadd_ps(d, x0, a##c##0);                          \
        a##c##1 = _mm256_fmadd_ps(d, x1, a##c##1);                          \
        a##c##2 = _mm256_fmadd_ps(d, x2, a##c##2);                          \
    }
#define DOT_STORE(c)                                                        \
    {                                                                       \
        float *pr = part + (co + c) * ldp + k;                              \
        pr[0] = (first ? 0.0f : pr[0]) + mdl_hsum_ps(a##c##0);              \
        pr[1] = (first ? 0.0f : pr[1]) + mdl_hsum_ps(a##c##1);              \
        pr[2] = (first ? 0.0f : pr[2]) + mdl_hsum_ps(a##c##2);              \
    }

void mdl_conv_weights_dot_avx2(int64_t c_out, int64_t K, int64_t ho, int64_t wo, int64_t wp,
                               int64_t images, int64_t xp_stride, const float *dy_all,
                               const float *xp_all, const int64_t *off, int first, float *part,
                               int64_t ldp)
{
    const int64_t P = ho * wo, co4 = c_out / 4 * 4, k3 = K / 3 * 3;
    for (int64_t co = 0; co < co4; co += 4)
        for (int64_t k = 0; k < k3; k += 3) {
            __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a10 = a00, a11 = a00;
            __m256 a12 = a00, a20 = a00, a21 = a00, a22 = a00, a30 = a00, a31 = a00, a32 = a00;
            for (int64_t im = 0; im < images; im++) {
                const float *dy = dy_all + im * c_out * P, *xp = xp_all + im * xp_stride;
                const float *r0 = xp + off[k], *r1 = xp + off[k + 1], *r2 = xp + off[k + 2];
                for (int64_t oh = 0; oh < ho; oh++)
                    for (int64_t ow = 0; ow < wo; ow += 8) {
                        const int64_t q = oh * wo + ow, o = oh * wp + ow;
                        const __m256 x0 = _mm256_loadu_ps(r0 + o), x1 = _mm256_loadu_ps(r1 + o);
                        const __m256 x2 = _mm256_loadu_ps(r2 + o);
                        DOT_FMA(0) DOT_FMA(1) DOT_FMA(2) DOT_FMA(3)
                    }
            }
            DOT_STORE(0) DOT_STORE(1) DOT_STORE(2) DOT_STORE(3)
        }
    /* the remaining channels or rows, one dot product at a time */
    for (int64_t co = 0; co < c_out; co++)
        for (int64_t k = co < co4 ? k3 : 0; k < K; k++) {
            __m256 acc = _mm256_setzero_ps();
            for (int64_t im = 0; im < images; im++) {
                const float *dy = dy_all + im * c_out * P, *r = xp_all + im * xp_stride + off[k];
                for (int64_t oh = 0; oh < ho; oh++)
                    for (int64_t ow = 0; ow < wo; ow += 8)
                        acc = _mm256_fmadd_ps(_mm256_loadu_ps(dy + co * P + oh * wo + ow),
                                              _mm256_loadu_ps(r + oh * wp + ow), acc);
            }
            float *pr = part + co * ldp + k;
            *pr = (first ? 0.0f : *pr) + mdl_hsum_ps(acc);
        }
}
#endif
