/* conv_avx2.c -- AVX2 pieces of the im2col convolution; compiled with -mavx2 -mfma.
 * Each vector loop is followed by a scalar tail. */
#include "common.h"
#if MDL_X86
#include <string.h>
#include <immintrin.h>
#include "conv.h"

/* sum of p[0, count), four independent 8-lane accumulators */
float mdl_conv_sum_avx2(const float *p, int64_t count)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= count; i += 32) {
        a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i));
        a1 = _mm256_add_ps(a1, _mm256_loadu_ps(p + i + 8));
        a2 = _mm256_add_ps(a2, _mm256_loadu_ps(p + i + 16));
        a3 = _mm256_add_ps(a3, _mm256_loadu_ps(p + i + 24));
    }
    for (; i + 8 <= count; i += 8) a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i));
    __m256 v = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q) + mdl_conv_sum_scalar(p + i, count - i);
}

/* dst[0, count) += src[0, count) */
static inline void add_row(float *dst, const float *src, int64_t count)
{
    int64_t i = 0;
    for (; i + 16 <= count; i += 16) {
        _mm256_storeu_ps(dst + i, _mm256_add_ps(_mm256_loadu_ps(dst + i), _mm256_loadu_ps(src + i)));
        _mm256_storeu_ps(dst + i + 8,
                         _mm256_add_ps(_mm256_loadu_ps(dst + i + 8), _mm256_loadu_ps(src + i + 8)));
    }
    for (; i + 8 <= count; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_add_ps(_mm256_loadu_ps(dst + i), _mm256_loadu_ps(src + i)));
    for (; i < count; i++) dst[i] += src[i];
}

/* dx planes [c0, c1) = col2im(col): each col row (ci, i, j) is added back at
 * its kernel offset; rows are contiguous when stride_w == 1. */
void mdl_conv_col2im_avx2(const mdl_conv2d_shape *s, int64_t ho, int64_t wo, const float *col,
                          float *dx, int64_t c0, int64_t c1)
{
    const int64_t h = s->h, w = s->w, kh = s->kh, kw = s->kw, sw = s->stride_w, sh = s->stride_h;
    const int64_t P = ho * wo;
    for (int64_t ci = c0; ci < c1; ci++) {
        float *plane = dx + ci * h * w;
        memset(plane, 0, (size_t)(h * w) * sizeof(float));
        for (int64_t i = 0; i < kh; i++) {
            int64_t oh0, oh1;
            mdl_conv_valid_range(h, ho, sh, s->pad_h, i, &oh0, &oh1);
            for (int64_t j = 0; j < kw; j++) {
                const float *row = col + ((ci * kh + i) * kw + j) * P;
                int64_t ow0, ow1;
                mdl_conv_valid_range(w, wo, sw, s->pad_w, j, &ow0, &ow1);
                if (ow0 == ow1) continue;
                for (int64_t oh = oh0; oh < oh1; oh++) {
                    float *d = plane + (oh * sh - s->pad_h + i) * w - s->pad_w + j;
                    const float *src = row + oh * wo;
                    if (sw == 1) {
                        add_row(d + ow0, src + ow0, ow1 - ow0);
                    } else {
                        for (int64_t ow = ow0; ow < ow1; ow++) d[ow * sw] += src[ow];
                    }
                }
            }
        }
    }
}
#endif
