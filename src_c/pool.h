/* pool.h -- internal: kernels of pool.c / pool_avx2.c, one (n, c) plane per call. */
#ifndef MDL_POOL_H
#define MDL_POOL_H
#include <math.h>
#include <stdint.h>
#include "common.h"

/* The geometry of one plane: input h x w, output ho x wo, window kh x kw.
 * Output columns [ow_lo, ow_hi) have windows that lie inside [0, w) in full
 * (no left padding, no right edge): the interior the SIMD kernels vectorise.
 * vec_ok is set when the SIMD kernels' 32-bit lane indices cannot overflow. */
typedef struct mdl_pool_geom {
    int64_t h, w, kh, kw, sh, sw, ph, pw, ho, wo;
    int64_t ow_lo, ow_hi;
    int vec_ok;
} mdl_pool_geom;

/* The shape check (mdl_pool2d_check_shape) and the geometry of one plane. */
mdl_status mdl_pool_geometry(const char *fn, const mdl_pool2d_shape *s, mdl_pool_geom *g);
/* y (planes, ho, wo) = the max (or average: avg) pooling of x (planes, h, w), then
 * max(y, 0) when relu; in the calling thread, by the kernels the SIMD level selects. */
void mdl_pool_planes(const mdl_pool_geom *g, int avg, int relu, int64_t planes, const float *x,
                     float *y);

/* Rows of the window of output row oh (columns alike): [lo, hi) clipped to the
 * input; *span is the unclipped extent, limited to the padded input, which is
 * PyTorch's avg-pool divisor factor (count_include_pad=True). */
static inline void mdl_pool_span(int64_t o, int64_t stride, int64_t pad, int64_t k, int64_t size,
                                 int64_t *lo, int64_t *hi, int64_t *span)
{
    int64_t start = o * stride - pad;
    int64_t end = start + k < size + pad ? start + k : size + pad;
    *span = end - start;
    *lo = start > 0 ? start : 0;
    *hi = end < size ? end : size;
}

/* The window's maximum and its flat index in the plane, PyTorch's CPU rule:
 * start at -inf with the first element's index; an element replaces the
 * maximum when it is greater or NaN (ties: the first wins). */
static inline int64_t mdl_pool_argmax(const float *x, int64_t w, int64_t hs, int64_t he,
                                      int64_t ws, int64_t we, float *max)
{
    int64_t best = hs * w + ws;
    float m = -INFINITY;
    for (int64_t ih = hs; ih < he; ih++)
        for (int64_t iw = ws; iw < we; iw++) {
            float v = x[ih * w + iw];
            if (v > m || isnan(v)) {
                m = v;
                best = ih * w + iw;
            }
        }
    *max = m;
    return best;
}

/* Scalar kernels for output row oh, columns [ow0, ow1) (the SIMD kernels use
 * them for the borders).  The backward ones accumulate into dx. */
void mdl_max_pool_cols_scalar(const mdl_pool_geom *g, const float *x, float *y, int64_t oh,
                              int64_t ow0, int64_t ow1);
void mdl_max_pool_back_cols_scalar(const mdl_pool_geom *g, const float *x, const float *dy,
                                   float *dx, int64_t oh, int64_t ow0, int64_t ow1);
/* As mdl_max_pool_cols_scalar, and tap[ow] = the winner's tap in its window, ky * kw + kx
 * from the window's unclipped corner (tap points at the output row). */
void mdl_max_pool_tap_cols_scalar(const mdl_pool_geom *g, const float *x, float *y,
                                  uint8_t *tap, int64_t oh, int64_t ow0, int64_t ow1);
void mdl_avg_pool_cols_scalar(const mdl_pool_geom *g, const float *x, float *y, int64_t oh,
                              int64_t ow0, int64_t ow1);
void mdl_avg_pool_back_cols_scalar(const mdl_pool_geom *g, const float *dy, float *dx, int64_t oh,
                                   int64_t ow0, int64_t ow1);

/* Whole planes: x (h, w), y / dy (ho, wo); the backward ones overwrite dx. */
void mdl_max_pool_plane_scalar(const mdl_pool_geom *g, const float *x, float *y);
void mdl_max_pool_back_plane_scalar(const mdl_pool_geom *g, const float *x, const float *dy,
                                    float *dx);
void mdl_max_pool_tap_plane_scalar(const mdl_pool_geom *g, const float *x, float *y,
                                   uint8_t *tap);
void mdl_avg_pool_plane_scalar(const mdl_pool_geom *g, const float *x, float *y);
void mdl_avg_pool_back_plane_scalar(const mdl_pool_geom *g, const float *dy, float *dx);
/* the backward of `planes` consecutive planes */
void mdl_avg_pool_back_planes_scalar(const mdl_pool_geom *g, int64_t planes, const float *dy,
                                     float *dx);
/* Global average: *y = mean of x[hw]; dx[hw] = dy / hw. */
float mdl_global_avg_scalar(int64_t hw, const float *x);
void mdl_global_avg_back_scalar(int64_t hw, float dy, float *dx);

#if MDL_X86
void mdl_max_pool_plane_avx2(const mdl_pool_geom *g, const float *x, float *y);
void mdl_max_pool_back_plane_avx2(const mdl_pool_geom *g, const float *x, const float *dy,
                                  float *dx);
void mdl_max_pool_tap_plane_avx2(const mdl_pool_geom *g, const float *x, float *y, uint8_t *tap);
void mdl_avg_pool_plane_avx2(const mdl_pool_geom *g, const float *x, float *y);
void mdl_avg_pool_back_planes_avx2(const mdl_pool_geom *g, int64_t planes, const float *dy,
                                   float *dx);
/* The backward from the taps (mdl_max_pool2d_backward_argmax's plane) for 3x3 windows at
 * stride 2 without padding, where _applies; 1 for an invalid tap */
int mdl_max_pool_back_taps_k3s2_applies(const mdl_pool_geom *g);
int mdl_max_pool_back_taps_k3s2_avx2(const mdl_pool_geom *g, const uint8_t *tap, const float *dy,
                                     float *dx);
float mdl_global_avg_avx2(int64_t hw, const float *x);
void mdl_global_avg_back_avx2(int64_t hw, float dy, float *dx);
/* pool_avx512.c: mdl_max_pool_plane_avx2's contract, where applies (strides 1 and 2
 * along the row, windows of 2 to 8 rows that overlap, rows of up to 256 outputs) */
int mdl_max_pool_avx512_applies(const mdl_pool_geom *g);
void mdl_max_pool_plane_avx512(const mdl_pool_geom *g, const float *x, float *y);
void mdl_max_pool_tap_plane_avx512(const mdl_pool_geom *g, const float *x, float *y,
                                   uint8_t *tap);
#else /* mdl_use_avx2() is never true off x86; these names only keep the dispatch compiling */
#  define mdl_max_pool_plane_avx2 mdl_max_pool_plane_scalar
#  define mdl_max_pool_back_plane_avx2 mdl_max_pool_back_plane_scalar
#  define mdl_max_pool_tap_plane_avx2 mdl_max_pool_tap_plane_scalar
#  define mdl_avg_pool_plane_avx2 mdl_avg_pool_plane_scalar
#  define mdl_avg_pool_back_planes_avx2 mdl_avg_pool_back_planes_scalar
#  define mdl_max_pool_back_taps_k3s2_applies(g) 0
#  define mdl_max_pool_back_taps_k3s2_avx2(g, tap, dy, dx) 1
#  define mdl_global_avg_avx2 mdl_global_avg_scalar
#  define mdl_global_avg_back_avx2 mdl_global_avg_back_scalar
#  define mdl_max_pool_avx512_applies(g) 0
#  define mdl_max_pool_plane_avx512 mdl_max_pool_plane_scalar
#  define mdl_max_pool_tap_plane_avx512 mdl_max_pool_tap_plane_scalar
#endif
#endif
