/* conv.h -- internal: pieces of the im2col convolution shared by conv.c and conv_avx2.c. */
#ifndef MDL_CONV_H
#define MDL_CONV_H
#include <stdint.h>
#include "common.h"
#include "gemm.h"

/* The output positions o in [0, n_out) whose input index o*stride - pad + k
 * lies in [0, n_in) form one range [*lo, *hi) (empty when *lo == *hi). */
static inline void mdl_conv_valid_range(int64_t n_in, int64_t n_out, int64_t stride, int64_t pad,
                                        int64_t k, int64_t *lo, int64_t *hi)
{
    int64_t first = pad - k;             /* o*stride >= pad - k */
    int64_t last = n_in - 1 + pad - k;   /* o*stride <= n_in - 1 + pad - k */
    int64_t a = first > 0 ? (first + stride - 1) / stride : 0;
    int64_t b = last < 0 ? 0 : last / stride + 1;
    if (b > n_out) b = n_out;
    if (a > b) a = b;
    *lo = a;
    *hi = b;
}

/* sum of p[0, count) */
float mdl_conv_sum_scalar(const float *p, int64_t count);

#if MDL_X86
/* One image: rows [r0, r1) of the column matrix (c_in*kh*kw, ho*wo) of x (c_in, h, w),
 * row r at col + (r - r0) * ld: row (ci, i, j), column (oh, ow) holds
 * x[ci, oh*stride_h - pad_h + i, ow*stride_w - pad_w + j], or 0 in the padding.
 * Used only by the im2col + SGEMM path, which runs when AVX2 is selected; the
 * scalar reference convolves directly. */
void mdl_conv_im2col_avx2(const mdl_conv2d_shape *s, int64_t ho, int64_t wo, const float *x,
                          float *col, int64_t ld, int64_t r0, int64_t r1);
/* One image: the planes of input channels [c0, c1) of dx (c_in, h, w) =
 * col2im(col), overwritten (or added to: accumulate); col is (c_in*kh*kw, ho*wo) with row stride ld.  The
 * adjoint of im2col. */
void mdl_conv_col2im_avx2(const mdl_conv2d_shape *s, int64_t ho, int64_t wo, const float *col,
                          int64_t ld, float *dx, int64_t c0, int64_t c1, int accumulate);
float mdl_conv_sum_avx2(const float *p, int64_t count);
/* One image's phase planes xp (c_in, nr, nq, rows, cols): plane (r, q) holds the
 * pixels (stride_h * y + r, stride_w * x + q) of x (c_in, h, w) padded with zeros, x read
 * through the map in (NULL: as it is; the padding stays zero) */
void mdl_conv_phase_image_avx2(const mdl_conv2d_shape *s, int64_t nr, int64_t nq, int64_t rows,
                               int64_t cols, const float *x, const mdl_affine *in, float *xp);
/* d[j + sw x] = (or +=, accumulate) src[j][x]: a row of w columns from sw sources */
void mdl_conv_interleave_row_avx2(int64_t sw, const float *const *src, int64_t w, float *d,
                                  int accumulate);
/* sum[r] and sumsq[r] (r < rows) += the sum and the sum of squares of row r of y
 * (rows, P): float over 128 values at a time, then double */
void mdl_conv_row_sums_avx2(int64_t rows, int64_t P, const float *y, double *sum, double *sumsq);
/* tx (c, hw) = x (c, hw) read through the map in, per channel */
void mdl_conv_affine_image_avx2(int64_t c, int64_t hw, const float *x, const mdl_affine *in,
                                float *tx);

/* The weight gradient of a few images with rows a multiple of 8 wide, as dot products
 * along the pixels, both operands read in place: part (c_out, K; rows ldp floats apart)
 * = (first ? 0 : part) + sum over the images of dy (c_out, ho * wo) @ col^T, where col
 * row k is the image's phase planes (row stride wp; images xp_stride floats apart)
 * shifted by off[k] */
void mdl_conv_weights_dot_avx2(int64_t c_out, int64_t K, int64_t ho, int64_t wo, int64_t wp,
                               int64_t images, int64_t xp_stride, const float *dy,
                               const float *xp, const int64_t *off, int first, float *part,
                               int64_t ldp);
/* The same with AVX-512F (conv_avx512.c). */
void mdl_conv_weights_dot_avx512(int64_t c_out, int64_t K, int64_t ho, int64_t wo, int64_t wp,
                                 int64_t images, int64_t xp_stride, const float *dy,
                                 const float *xp, const int64_t *off, int first, float *part,
                                 int64_t ldp);

/* Winograd F(2x2, 3x3) and F(2x2, 5x5) (winograd_avx2.c): stride 1, padding < kernel.
 * The weights are transformed once per call into `fixed` (fixed_floats); each
 * image then needs thread_floats of scratch.  Buffers 64-byte aligned. */
int mdl_winograd_applies(const mdl_conv2d_shape *s);
size_t mdl_winograd_fixed_floats(const mdl_conv2d_shape *s);
size_t mdl_winograd_thread_floats(const mdl_conv2d_shape *s, int64_t ho, int64_t wo);
void mdl_winograd_weights(const mdl_conv2d_shape *s, const float *w, float *fixed);
/* y (c_out, ho, wo) of one image x (c_in, h, w), with the epilogue ep (or NULL) */
void mdl_winograd_image(const mdl_conv2d_shape *s, int64_t ho, int64_t wo, const float *fixed,
                        const float *x, const mdl_epilogue *ep, float *y, float *buf);
/* Winograd F(4x4, 3x3) and F(4x4, 5x5) with 16 channels to a vector (winograd_avx512.c):
 * stride 1, padding < kernel, c_in and c_out multiples of 16.  The weights are transformed once per
 * call into `u` (fixed_floats); a call takes up to `group` images (grad 0; grad 1: the
 * weight gradient's calls, mdl_winograd_avx512_grad_images), with thread_floats
 * of scratch (64-byte aligned).  Of `images` images x (c_in, h, w), read through the map
 * in (NULL: as they are), y (c_out, ho, wo) = or += (accumulate, then bias NULL and relu
 * 0) the convolution, plus bias, then ReLU; sums (images, 2, c_out), or NULL, gets each
 * image's channel sums and sums of squares of y. */
/* The functions of one instantiation of winograd_channels.h, named P##_X.  Their
 * weight gradient: each thread adds, per call of up to `group` images, the
 * transformed gradient dU (points, c_in, c_out), in double, of `images` images x (read
 * through in) and dy (c_out, ho, wo) to its part `du` (zeroed by the caller), with
 * grad_thread_floats of scratch (du included, first); grad_finish sets or adds to dw
 * (c_out, c_in, kh, kw) the sum of the nparts parts (part_stride doubles apart), plus
 * the float dU `single` unless NULL, for the channel pairs ci * c_out + co in [lo, hi),
 * lo and hi multiples of the channels to a vector (16 or 8).  For many channels, the
 * steps around SGEMMs over all the tiles of `images` images (tile-major: rows of points
 * c_in or points c_out floats): tiles_v writes V and tiles_dm dM (each with tiles_floats of
 * scratch), tiles_y gives y from M with the epilogue of _images.  Both gradients at
 * once (conv.c's backward_winograd): where backward_applies, backward_images gives dx
 * (= or += conv(dy, flipped w) with t, the data gradient's convolution, and ut its
 * transformed weights) and adds dU to du as the two calls would, transposing dy once,
 * with backward_thread_floats of scratch (du included, first). */
#define MDL_WINOGRAD_M 4 /* outputs per side of a tile */
/* transform points per side of a tile: 6 for F(4x4, 3x3), 8 for F(4x4, 5x5); in all */
static inline int64_t mdl_winograd_alpha(const mdl_conv2d_shape *s)
{
    return MDL_WINOGRAD_M + s->kh - 1;
}
static inline int64_t mdl_winograd_points(const mdl_conv2d_shape *s)
{
    return mdl_winograd_alpha(s) * mdl_winograd_alpha(s);
}
#define MDL_WINOGRAD_CHANNELS_DECLARE(P)                                                     \
    int P##_applies(const mdl_conv2d_shape *s);                                             \
    size_t P##_fixed_floats(const mdl_conv2d_shape *s);                                     \
    int64_t P##_group(const mdl_conv2d_shape *s, int64_t ho, int64_t wo, int grad);         \
    size_t P##_thread_floats(const mdl_conv2d_shape *s, int64_t ho, int64_t wo);            \
    void P##_weights(const mdl_conv2d_shape *s, const float *w, float *u);                  \
    void P##_images(const mdl_conv2d_shape *s, int64_t ho, int64_t wo, const float *u,      \
                    int64_t images, const float *x, const mdl_affine *in, const float *bias, \
                    int relu, double *sums, int accumulate, float *y, float *buf);          \
    size_t P##_grad_thread_floats(const mdl_conv2d_shape *s, int64_t ho, int64_t wo);       \
    void P##_grad_images(const mdl_conv2d_shape *s, int64_t ho, int64_t wo, int64_t images, \
                         const float *x, const mdl_affine *in, const float *dy, double *du, \
                         float *buf);                                                       \
    size_t P##_tiles_floats(const mdl_conv2d_shape *s, int64_t ho, int64_t wo);             \
    void P##_tiles_v(const mdl_conv2d_shape *s, int64_t ho, int64_t wo, int64_t images,     \
                     const float *x, const mdl_affine *in, float *v, float *buf);           \
    void P##_tiles_dm(const mdl_conv2d_shape *s, int64_t ho, int64_t wo, int64_t images,    \
                      const float *dy, float *dm, float *buf);                              \
    void P##_tiles_y(const mdl_conv2d_shape *s, int64_t ho, int64_t wo, int64_t images,     \
                     const float *m, const float *bias, int relu, double *sums,             \
                     int accumulate, float *y);                                             \
    void P##_grad_finish(const mdl_conv2d_shape *s, const double *parts, int nparts,        \
                         size_t part_stride, const float *single, int64_t lo, int64_t hi,   \
                         float *dw, int accumulate);                                        \
    int P##_backward_applies(const mdl_conv2d_shape *s, const mdl_conv2d_shape *t,          \
                             int64_t ho, int64_t wo);                                       \
    size_t P##_backward_thread_floats(const mdl_conv2d_shape *s, const mdl_conv2d_shape *t, \
                                      int64_t ho, int64_t wo);                              \
    void P##_backward_images(const mdl_conv2d_shape *s, const mdl_conv2d_shape *t,          \
                             int64_t ho, int64_t wo, const float *ut, int64_t images,       \
                             const float *x, const mdl_affine *in, const float *dy,         \
                             int accumulate, float *dx, double *du, float *buf)
MDL_WINOGRAD_CHANNELS_DECLARE(mdl_winograd_avx512);
/* The same with 8 channels to a vector (winograd8_avx2.c, for CPUs without AVX-512):
 * c_in and c_out multiples of 8, the same contracts. */
MDL_WINOGRAD_CHANNELS_DECLARE(mdl_winograd8);
#else /* mdl_use_avx2() is never true off x86; this name only keeps the dispatch compiling */
#  define mdl_conv_sum_avx2 mdl_conv_sum_scalar
#endif
#endif
