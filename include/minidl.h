/*
 * minidl.h -- the public C API of the minidl core.
 *
 * Overview
 * --------
 * Plain C kernels for training convolutional nets on the CPU: SGEMM, 2-D
 * convolution, pooling, ReLU, BatchNorm, linear layers, softmax
 * cross-entropy, dropout and optimizer steps.  Every kernel works on raw
 * float32 pointers in NCHW layout with explicit shapes, has a forward and a
 * backward, and comes in two versions: a plain scalar reference and an
 * AVX2+FMA version, chosen at run time from CPU feature detection.  On CPUs
 * with AVX-512F a third level uses an AVX-512 SGEMM (and the AVX2 versions
 * of every other kernel).
 *
 * Conventions
 * -----------
 *  - Every function that can fail returns an mdl_status; MDL_OK is 0.  On
 *    failure mdl_last_error() returns a message (per thread) naming the bad
 *    argument.  The library never aborts, exits or prints.
 *  - Sizes are int64_t; tensors are dense and row-major (C order).
 *  - Gradients of inputs (dx) are overwritten.  Gradients of parameters (dw,
 *    db, dgamma, dbeta) are overwritten when `accumulate` is 0 and added to
 *    when it is 1.
 *  - Functions that need scratch memory take (workspace, workspace_bytes)
 *    and say how much with a *_workspace_size() function.  Passing NULL makes
 *    the call use the library's own: one block, kept after the call for the
 *    next one that it is large enough for (mdl_set_keep_workspace); a non-NULL
 *    workspace that is too small is an error (MDL_ERR_WORKSPACE).
 *  - Threads: OpenMP, count from mdl_set_num_threads() or the environment
 *    variable MINIDL_NUM_THREADS; by default the cores this process may use.
 *  - SIMD: the best available version is used unless mdl_set_simd() or the
 *    environment variable MINIDL_SIMD (scalar | avx2 | avx512) asks otherwise.
 *
 * Example
 * -------
 *     #include <minidl.h>
 *     float a[2*3] = {1,2,3,4,5,6}, b[3*2] = {1,0,0,1,1,1}, c[2*2];
 *     if (mdl_sgemm(0, 0, 2, 2, 3, 1.0f, a, 3, b, 2, 0.0f, c, 2, NULL, 0) != MDL_OK)
 *         fprintf(stderr, "minidl: %s\n", mdl_last_error());
 *
 * Link with `pkg-config --cflags --libs minidl`, or with the copy installed
 * alongside the Python package: `python -m minidl --cflags --libs`.
 */
#ifndef MINIDL_H
#define MINIDL_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#  define MDL_API __declspec(dllexport)
#elif defined(__GNUC__)
#  define MDL_API __attribute__((visibility("default")))
#else
#  define MDL_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define MDL_VERSION_MAJOR 0
#define MDL_VERSION_MINOR 1
#define MDL_VERSION_PATCH 0

/* ------------------------------------------------------------------------ */
/* Status, errors, version                                                   */
/* ------------------------------------------------------------------------ */

typedef enum mdl_status {
    MDL_OK = 0,
    MDL_ERR_ARG = 1,         /* invalid argument: NULL pointer, bad size or shape */
    MDL_ERR_WORKSPACE = 2,   /* the workspace given is smaller than required */
    MDL_ERR_ALLOC = 3,       /* out of memory */
    MDL_ERR_UNSUPPORTED = 4, /* not available on this CPU or in this build */
    MDL_ERR_DEVICE = 5       /* a GPU error (minidl_cuda.h): no device, launch failure, ... */
} mdl_status;

/* A constant string naming the status ("ok", "invalid argument", ...). */
MDL_API const char *mdl_status_string(mdl_status status);
/* The message of the last failed call on this thread ("" if none). */
MDL_API const char *mdl_last_error(void);
/* The library version, "MAJOR.MINOR.PATCH". */
MDL_API const char *mdl_version(void);
/* Whether calls given a NULL workspace keep the scratch memory they allocate for the
 * next such call (keep 1, the default: one block, no larger than the largest call's
 * need) or free it when they return (keep 0, which also frees the block kept now). */
MDL_API void mdl_set_keep_workspace(int keep);
MDL_API int mdl_get_keep_workspace(void);

/* ------------------------------------------------------------------------ */
/* Threads and SIMD dispatch                                                 */
/* ------------------------------------------------------------------------ */

/* 1 <= n <= 4096 sets the thread count; n == 0 restores the default. */
MDL_API mdl_status mdl_set_num_threads(int n);
MDL_API int mdl_get_num_threads(void);
/* Regions doing fewer than `work` scalar operations run on one thread
 * (default 65536), since starting threads costs more than it saves there.
 * 0 parallelises every region: tests use it to exercise the threaded paths
 * on small shapes.  work < 0 is an error. */
MDL_API mdl_status mdl_set_min_parallel_work(int64_t work);

typedef enum mdl_simd {
    MDL_SIMD_SCALAR = 0,     /* plain C reference kernels */
    MDL_SIMD_AVX2 = 1,       /* AVX2 + FMA kernels */
    MDL_SIMD_AVX512 = 2      /* AVX-512F SGEMM (the GEMM-based ops too); AVX2 + FMA elsewhere */
} mdl_simd;

/* The best level this CPU supports (AVX-512 needs AVX-512F, AVX2 and FMA).
 * Each level includes the ones below it. */
MDL_API mdl_simd mdl_cpu_simd(void);
/* Select the kernels to use; MDL_ERR_UNSUPPORTED if the CPU lacks the level. */
MDL_API mdl_status mdl_set_simd(mdl_simd level);
MDL_API mdl_simd mdl_get_simd(void);

/* ------------------------------------------------------------------------ */
/* SGEMM                                                                     */
/* ------------------------------------------------------------------------ */

/* C[m,n] = alpha * op(A)[m,k] @ op(B)[k,n] + beta * C, row-major.
 * op(A) is A (m x k, leading dimension lda) or, with trans_a, A^T where A is
 * k x m.  Likewise for B.  beta == 0 overwrites C without reading it; alpha == 0
 * reads neither A nor B (they may be NULL), as in BLAS, so NaN there does not reach
 * C.  An operand that spans 2^60 elements or more (rows times leading dimension) is
 * an error, and the workspace size of such a shape is SIZE_MAX. */
MDL_API size_t mdl_sgemm_workspace_size(int64_t m, int64_t n, int64_t k);
MDL_API mdl_status mdl_sgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                             float alpha, const float *a, int64_t lda,
                             const float *b, int64_t ldb,
                             float beta, float *c, int64_t ldc,
                             void *workspace, size_t workspace_bytes);

/* Whether the AVX-512 SGEMM reads op(B) in place (not transposed) for C of 29 to 256
 * rows, where it may, or packs it.  MDL_SGEMM_B_AUTO (the default) packs it on Intel
 * CPUs, where that measured 1.14-1.37x faster on the convolutions' products of 32 and
 * 64 rows, and reads it in place elsewhere (AMD's Zen 4: 1.07-1.24x the other way).
 * The result is the same either way; tests set the others to reach both paths. */
typedef enum mdl_sgemm_b {
    MDL_SGEMM_B_AUTO = 0,
    MDL_SGEMM_B_IN_PLACE = 1,
    MDL_SGEMM_B_PACKED = 2
} mdl_sgemm_b;
MDL_API mdl_status mdl_set_sgemm_b(mdl_sgemm_b mode);

/* ------------------------------------------------------------------------ */
/* 2-D convolution (cross-correlation, as in PyTorch)                       */
/* ------------------------------------------------------------------------ */

typedef struct mdl_conv2d_shape {
    int64_t n, c_in, h, w;          /* input x:  (n, c_in, h, w) */
    int64_t c_out, kh, kw;          /* weight w: (c_out, c_in, kh, kw) */
    int64_t stride_h, stride_w;     /* >= 1 */
    int64_t pad_h, pad_w;           /* >= 0, zero padding */
} mdl_conv2d_shape;

/* The algorithm of the SIMD convolutions.  MDL_CONV_AUTO (the default) uses
 * Winograd where it was measured to pay and an implicit GEMM elsewhere: on a CPU
 * with AVX-512 (AVX2: 8 instead of 16), F(4x4, 3x3) and F(4x4, 5x5) for stride 1,
 * padding < kernel, input and output channels multiples of 16 (with AVX-512, multiples
 * of 8 as on AVX2 for the weight gradient, and for the forward and data gradient from
 * 16 input channels or 256 channel pairs up to 64 * 128), summing over the
 * channels in registers or by one SGEMM per transform point over the tiles of a chunk
 * of images (mdl_set_winograd_sums); otherwise F(2x2, 3x3) for 3x3 kernels with
 * stride 1, padding <= 2, at least 64 input and output channels and outputs at least 16 wide (forward, and
 * backward_data through the equivalent forward of dy).  Images that lie inside every
 * output pixel's window with fewer pixels than the kernel has taps (2x2 under 3x3
 * with padding 1), from 16 images on, take one SGEMM over the batch with the weights
 * spread into the dense matrix of the map from an image to its output (before
 * Winograd; also under MDL_CONV_GEMM).  The GEMM of outputs of at most 64 pixels with
 * stride 1, padding < kernel, from 16 images on a CPU with AVX-512, runs 16 images at
 * a time over the taps inside the image only (forward and data gradient); with
 * outputs of at most 16 pixels the weight gradient goes by taps, one SGEMM per tap
 * over the batch, on either SIMD level.
 * MDL_CONV_GEMM and MDL_CONV_WINOGRAD choose
 * one (Winograd only where it applies).  The environment
 * variable MINIDL_CONV (auto | gemm | winograd) sets the starting value.  The
 * scalar reference kernels always convolve directly. */
typedef enum mdl_conv_algo {
    MDL_CONV_AUTO = 0,
    MDL_CONV_GEMM = 1,
    MDL_CONV_WINOGRAD = 2
} mdl_conv_algo;
MDL_API mdl_status mdl_set_conv_algo(mdl_conv_algo algo);
MDL_API mdl_conv_algo mdl_get_conv_algo(void);

/* How the channel Winograd (F(4x4) above) sums over the channels, or the weight
 * gradient over the tiles: in registers, a chunk of a few tiles at a time, each chunk
 * reading all of the transformed weights (36 c_in c_out floats for 3x3, 64 for 5x5),
 * or by one SGEMM per transform point over the tiles of a chunk of images.
 * MDL_WINOGRAD_SUMS_AUTO (the default): the weight gradient in registers up to c_in *
 * c_out = 128 * 128; the forward and the data gradient on Intel CPUs with AVX-512 (the
 * Xeons, whose L3 feeds a core slowly) in registers while the transformed weights fit
 * in 5/8 of a core's L2 (1.25 MiB of 2 MiB: 3x3 up to 64 x 128 channels), beyond which
 * reading them from L3 for every chunk measured 1.2-3.4x slower (256 -> 256 at 8x8), and
 * elsewhere up to 128 * 256 (256 * 256 for outputs at least 8 wide), as measured on
 * AMD's Zen 4.  MDL_WINOGRAD_SUMS_REGISTERS and MDL_WINOGRAD_SUMS_SGEMM force one in
 * every direction; both round to about the same error, not to the same bits.  Query
 * mdl_conv2d_workspace_size after a change. */
typedef enum mdl_winograd_sums {
    MDL_WINOGRAD_SUMS_AUTO = 0,
    MDL_WINOGRAD_SUMS_REGISTERS = 1,
    MDL_WINOGRAD_SUMS_SGEMM = 2
} mdl_winograd_sums;
MDL_API mdl_status mdl_set_winograd_sums(mdl_winograd_sums mode);

/* Output y: (n, c_out, h_out, w_out), h_out = (h + 2 pad_h - kh) / stride_h + 1. */
MDL_API mdl_status mdl_conv2d_output_size(const mdl_conv2d_shape *s,
                                          int64_t *h_out, int64_t *w_out);
/* Scratch bytes needed by forward, backward_data and backward_weights with the
 * current thread count (mdl_set_num_threads).  A smaller workspace, down to the
 * size for one thread, also works: the calls then use as many threads as fit. */
MDL_API size_t mdl_conv2d_workspace_size(const mdl_conv2d_shape *s);
/* y = conv(x, w) + bias; bias (c_out) may be NULL. */
MDL_API mdl_status mdl_conv2d_forward(const mdl_conv2d_shape *s, const float *x,
                                      const float *w, const float *bias, float *y,
                                      void *workspace, size_t workspace_bytes);
/* The forward with an epilogue applied while each output tile is still in
 * registers: y = conv(x, w) + bias, then y = max(y, 0) when relu is non-zero (NaN
 * stays NaN, as in mdl_relu_forward), then channel_sum[co] and channel_sumsq[co]
 * (float64, overwritten; either may be NULL) = the sum and the sum of squares of the
 * final y over n, h_out and w_out (the statistics of a BatchNorm that follows, without
 * another pass over y). */
MDL_API mdl_status mdl_conv2d_forward_ex(const mdl_conv2d_shape *s, const float *x,
                                         const float *w, const float *bias, int relu,
                                         double *channel_sum, double *channel_sumsq, float *y,
                                         void *workspace, size_t workspace_bytes);
/* A per-channel affine map and ReLU, x -> max(x * scale[ch] + shift[ch], 0) (the
 * max only when relu is non-zero; scale and shift both NULL: x itself): how a
 * fused kernel reads an operand that a BatchNorm (and ReLU) would otherwise have
 * written to memory first.  A NULL mdl_affine pointer means the operand as it is. */
typedef struct mdl_affine {
    const float *scale, *shift;     /* (channels) each, or both NULL */
    int relu;
} mdl_affine;

/* The fused forward: as mdl_conv2d_forward_ex, reading the input through `in`
 * (c_in channels; NULL: x as it is): the convolution of max(x * scale + shift, 0),
 * the zero padding staying zero.  A BatchNorm's normalisation and the ReLU after it
 * are applied as each image is read, so their output is never written. */
MDL_API mdl_status mdl_conv2d_forward_fused(const mdl_conv2d_shape *s, const float *x,
                                            const mdl_affine *in, const float *w,
                                            const float *bias, int relu, double *channel_sum,
                                            double *channel_sumsq, float *y,
                                            void *workspace, size_t workspace_bytes);
/* dx = conv_transpose(dy, w), overwritten. */
MDL_API mdl_status mdl_conv2d_backward_data(const mdl_conv2d_shape *s, const float *dy,
                                            const float *w, float *dx,
                                            void *workspace, size_t workspace_bytes);
/* dx = or += (accumulate non-zero) conv_transpose(dy, w): the sum with another
 * gradient of the same input (a residual block's) made by the kernel's store
 * instead of a separate pass. */
MDL_API mdl_status mdl_conv2d_backward_data_fused(const mdl_conv2d_shape *s, const float *dy,
                                                  const float *w, float *dx, int accumulate,
                                                  void *workspace, size_t workspace_bytes);
/* dw (c_out, c_in, kh, kw) = or += correlation of x with dy. */
MDL_API mdl_status mdl_conv2d_backward_weights(const mdl_conv2d_shape *s, const float *x,
                                               const float *dy, float *dw, int accumulate,
                                               void *workspace, size_t workspace_bytes);
/* mdl_conv2d_backward_weights of the input read through `in` (as in
 * mdl_conv2d_forward_fused; NULL: x as it is), recomputed as each image is read. */
MDL_API mdl_status mdl_conv2d_backward_weights_fused(const mdl_conv2d_shape *s, const float *x,
                                                     const mdl_affine *in, const float *dy,
                                                     float *dw, int accumulate,
                                                     void *workspace, size_t workspace_bytes);
/* Both gradients in one call: dx = or += (accumulate_dx) conv_transpose(dy, w), none
 * when dx is NULL, and dw = or += (accumulate_dw) the weight gradient of x read through
 * `in` (NULL: x as it is): the values of mdl_conv2d_backward_data_fused and
 * mdl_conv2d_backward_weights_fused.  Where both take the channel-vector Winograd (3x3
 * and 5x5, stride 1, channels in multiples of 8), dy is read and transposed once for
 * both. */
MDL_API mdl_status mdl_conv2d_backward(const mdl_conv2d_shape *s, const float *x,
                                       const mdl_affine *in, const float *dy, const float *w,
                                       float *dx, int accumulate_dx, float *dw,
                                       int accumulate_dw, void *workspace,
                                       size_t workspace_bytes);
/* db (c_out) = or += sum of dy over n, h_out, w_out. */
MDL_API mdl_status mdl_conv2d_backward_bias(const mdl_conv2d_shape *s, const float *dy,
                                            float *db, int accumulate);

/* ------------------------------------------------------------------------ */
/* Pooling                                                                   */
/* ------------------------------------------------------------------------ */

typedef struct mdl_pool2d_shape {
    int64_t n, c, h, w;             /* input x: (n, c, h, w) */
    int64_t kh, kw;                 /* window, >= 1 */
    int64_t stride_h, stride_w;     /* >= 1 */
    int64_t pad_h, pad_w;           /* 0 <= pad <= kernel / 2 */
    int ceil_mode;                  /* round output size up instead of down */
} mdl_pool2d_shape;

/* Output (n, c, h_out, w_out) with PyTorch's rule: in ceil mode the last
 * window must start inside the input or its left padding. */
MDL_API mdl_status mdl_pool2d_output_size(const mdl_pool2d_shape *s,
                                          int64_t *h_out, int64_t *w_out);
/* Max over each window; padding never wins; NaN propagates; ties go to the
 * first element in row-major window order. */
MDL_API mdl_status mdl_max_pool2d_forward(const mdl_pool2d_shape *s, const float *x, float *y);
/* dx = scatter of dy to each window's maximum, recomputed from x. */
MDL_API mdl_status mdl_max_pool2d_backward(const mdl_pool2d_shape *s, const float *x,
                                           const float *dy, float *dx);
/* The max pooling of x read through `in` (channel = plane % c; NULL: x as it is;
 * see mdl_affine), forward and backward: a BatchNorm's normalisation and ReLU
 * applied as the window is read, dx the gradient with respect to the mapped input. */
MDL_API mdl_status mdl_max_pool2d_forward_fused(const mdl_pool2d_shape *s, const float *x,
                                                const mdl_affine *in, float *y);
MDL_API mdl_status mdl_max_pool2d_backward_fused(const mdl_pool2d_shape *s, const float *x,
                                                 const mdl_affine *in, const float *dy,
                                                 float *dx);
/* Max pooling (of x read through `in`, as above; NULL: x as it is) that also writes
 * each output's tap, the position of its window's maximum as ky * kw + kx from the
 * window's unclipped top-left corner (n, c, h_out, w_out bytes; windows of at most
 * 256 elements), so that the backward needs the taps (1 byte per output) instead of
 * x.  The backward overwrites dx with the scatter of dy to the taps, the same sums
 * as mdl_max_pool2d_backward(_fused); MDL_POOL_NO_TAP in a window of fewer than 256
 * elements sends nothing, any other tap outside its window's part inside the input is
 * an error. */
MDL_API mdl_status mdl_max_pool2d_forward_argmax(const mdl_pool2d_shape *s, const float *x,
                                                 const mdl_affine *in, float *y, uint8_t *tap);
/* The tap of an output that passes no gradient back (mdl_max_pool2d_forward_argmax_relu);
 * in windows of fewer than 256 elements no position has it. */
#define MDL_POOL_NO_TAP 255
/* mdl_max_pool2d_forward_argmax followed by a ReLU, in the same pass: y = 0 where the
 * window's maximum is below 0 (as mdl_relu_forward), and where it is not above 0 (0,
 * -0 or NaN) the tap is MDL_POOL_NO_TAP, so that mdl_max_pool2d_backward_argmax gives
 * the gradient of max(max_pool(x), 0), the ReLU's mask included.  Windows of at most
 * 255 elements. */
MDL_API mdl_status mdl_max_pool2d_forward_argmax_relu(const mdl_pool2d_shape *s,
                                                      const float *x, const mdl_affine *in,
                                                      float *y, uint8_t *tap);
MDL_API mdl_status mdl_max_pool2d_backward_argmax(const mdl_pool2d_shape *s, const uint8_t *tap,
                                                  const float *dy, float *dx);
/* Mean over each window counting padding (count_include_pad=True). */
MDL_API mdl_status mdl_avg_pool2d_forward(const mdl_pool2d_shape *s, const float *x, float *y);
MDL_API mdl_status mdl_avg_pool2d_backward(const mdl_pool2d_shape *s, const float *dy, float *dx);
/* mdl_avg_pool2d_backward with the backward of a ReLU before the pool in the same pass:
 * x (n, c, h, w) is the pool's input, the ReLU's output, and dx is 0 where x is not
 * above 0 (mdl_relu_backward(x, dx)). */
MDL_API mdl_status mdl_avg_pool2d_backward_relu(const mdl_pool2d_shape *s, const float *x,
                                                const float *dy, float *dx);

/* A convolution and the pooling of its output in one call: y = pooled(conv(x, w) +
 * bias, then max(., 0) when relu), then max(., 0) again when pool_relu, with the
 * max (pool_kind MDL_POOL_MAX) or average (MDL_POOL_AVG) pooling of shape `pool`,
 * whose n, c, h, w must be the convolution's output (n, c_out, h_out, w_out).  Each
 * image's convolution output goes to a per-thread buffer in the workspace and is
 * pooled from the cache, so it is never written to y's memory: y is the pooled
 * (n, c_out, pool h_out, pool w_out).  The same values as mdl_conv2d_forward_ex,
 * then the pooling, then a ReLU. */
typedef enum mdl_pool_kind {
    MDL_POOL_MAX = 0,
    MDL_POOL_AVG = 1
} mdl_pool_kind;
/* Scratch bytes, as mdl_conv2d_workspace_size, plus the per-thread buffers; 0 for
 * an invalid shape. */
MDL_API size_t mdl_conv2d_pooled_workspace_size(const mdl_conv2d_shape *s,
                                                const mdl_pool2d_shape *pool);
MDL_API mdl_status mdl_conv2d_forward_pooled(const mdl_conv2d_shape *s, const float *x,
                                             const float *w, const float *bias, int relu,
                                             const mdl_pool2d_shape *pool,
                                             mdl_pool_kind pool_kind, int pool_relu, float *y,
                                             void *workspace, size_t workspace_bytes);

/* y (n, c) = mean of x (n, c, h, w) over h and w. */
MDL_API mdl_status mdl_global_avg_pool2d_forward(int64_t n, int64_t c, int64_t h, int64_t w,
                                                 const float *x, float *y);
/* dx (n, c, h, w) = dy (n, c) / (h * w). */
MDL_API mdl_status mdl_global_avg_pool2d_backward(int64_t n, int64_t c, int64_t h, int64_t w,
                                                  const float *dy, float *dx);

/* ------------------------------------------------------------------------ */
/* Elementwise: ReLU, add, dropout                                           */
/* ------------------------------------------------------------------------ */

/* y[i] = max(x[i], 0) (NaN stays NaN); y may equal x. */
MDL_API mdl_status mdl_relu_forward(int64_t count, const float *x, float *y);
/* dx[i] = x[i] > 0 ? dy[i] : 0; dx may equal dy. */
MDL_API mdl_status mdl_relu_backward(int64_t count, const float *x, const float *dy, float *dx);
/* y[i] = a[i] + b[i]; y may equal a or b. */
MDL_API mdl_status mdl_add(int64_t count, const float *a, const float *b, float *y);

/* y = act(fa(a) + fb(b)) over (n, c, hw), per channel: fa and fb read a and b
 * through mdl_affine maps (NULL: as they are), act = max(., 0) when relu is
 * non-zero.  b may be NULL: y = act(fa(a)).  y may equal a or b.  A residual
 * addition of BatchNorm outputs with the ReLU after it, in one pass. */
MDL_API mdl_status mdl_affine_add(int64_t n, int64_t c, int64_t hw, const float *a,
                                  const mdl_affine *fa, const float *b, const mdl_affine *fb,
                                  int relu, float *y);

/* Inverted dropout: element i is kept when a counter-based hash of
 * (seed, i) maps to u >= p, and kept elements are scaled by 1 / (1 - p).
 * The mask is a pure function of (seed, i), so the backward recomputes it
 * and the result does not depend on the thread count.  0 <= p < 1. */
MDL_API mdl_status mdl_dropout_forward(int64_t count, float p, uint64_t seed,
                                       const float *x, float *y);
MDL_API mdl_status mdl_dropout_backward(int64_t count, float p, uint64_t seed,
                                        const float *dy, float *dx);

/* ------------------------------------------------------------------------ */
/* BatchNorm2d over (n, c, hw): statistics per channel                       */
/* ------------------------------------------------------------------------ */

/* Training: normalise with the batch mean and biased variance, write
 * save_mean and save_invstd = 1 / sqrt(var + eps) (c each), and, if
 * running_mean and running_var are not NULL, update them in place:
 * r = (1 - momentum) r + momentum * stat, with the unbiased variance. */
MDL_API mdl_status mdl_batch_norm_forward_train(int64_t n, int64_t c, int64_t hw,
                                                const float *x, const float *gamma,
                                                const float *beta, float eps, float momentum,
                                                float *running_mean, float *running_var,
                                                float *y, float *save_mean, float *save_invstd);
/* Inference: y = (x - running_mean) / sqrt(running_var + eps) * gamma + beta. */
MDL_API mdl_status mdl_batch_norm_forward_infer(int64_t n, int64_t c, int64_t hw,
                                                const float *x, const float *gamma,
                                                const float *beta, const float *running_mean,
                                                const float *running_var, float eps, float *y);
/* Backward of the training forward: dx overwritten; dgamma, dbeta (c) = or +=. */
MDL_API mdl_status mdl_batch_norm_backward(int64_t n, int64_t c, int64_t hw,
                                           const float *x, const float *gamma, const float *dy,
                                           const float *save_mean, const float *save_invstd,
                                           float *dx, float *dgamma, float *dbeta,
                                           int accumulate);

/* BatchNorm's training statistics from the per-channel float64 sums of its
 * count = n * hw inputs (the channel_sum and channel_sumsq of a fused
 * convolution): save_mean and save_invstd as mdl_batch_norm_forward_train writes
 * them, the running statistics updated the same way (both NULL: not updated), and
 * the normalisation as an affine map, scale = gamma * invstd and shift = beta -
 * mean * scale (c each), for the kernels that apply it as they read (mdl_affine).
 * count > 1. */
MDL_API mdl_status mdl_batch_norm_stats(int64_t c, int64_t count, const double *channel_sum,
                                        const double *channel_sumsq, const float *gamma,
                                        const float *beta, float eps, float momentum,
                                        float *running_mean, float *running_var,
                                        float *save_mean, float *save_invstd, float *scale,
                                        float *shift);
/* mdl_batch_norm_backward of max(BatchNorm(x), 0): dy, the gradient of the ReLU's
 * output, counts only where x * scale + shift > 0 (the map of mdl_batch_norm_stats;
 * the ReLU's output is recomputed, not read). */
MDL_API mdl_status mdl_batch_norm_relu_backward(int64_t n, int64_t c, int64_t hw,
                                                const float *x, const float *gamma,
                                                const float *dy, const float *save_mean,
                                                const float *save_invstd, const float *scale,
                                                const float *shift, float *dx, float *dgamma,
                                                float *dbeta, int accumulate);

/* The backward of y = max(BatchNorm(x) + fb(b), 0), a residual block's end, with
 * BatchNorm's input x not stored: it is reconstructed from the sum before the ReLU,
 * s = BatchNorm(x) + fb(b) (y = max(s, 0)), and the other operand b (read through
 * its map fb, NULL: as it is): x - mean = (s - fb(b) - beta) / (gamma * invstd).
 * dy is the gradient of y.  Writes db = dy where s > 0, else 0 (the gradient of
 * fb(b) and of BatchNorm's output; db may equal dy), and dx, dgamma, dbeta as
 * mdl_batch_norm_backward.  Every gamma * save_invstd must be non-zero; the
 * reconstruction's error in (x - mean) * invstd is about 2^-24 * (|s| + |fb(b)| +
 * |beta|) / |gamma|. */
MDL_API mdl_status mdl_batch_norm_add_relu_backward(int64_t n, int64_t c, int64_t hw,
                                                    const float *s, const float *b,
                                                    const mdl_affine *fb, const float *gamma,
                                                    const float *beta, const float *dy,
                                                    const float *save_invstd, float *dx,
                                                    float *db, float *dgamma, float *dbeta,
                                                    int accumulate);

/* ------------------------------------------------------------------------ */
/* Fully connected: y (n, out) = x (n, in) @ w^T + b, w is (out, in)         */
/* ------------------------------------------------------------------------ */

MDL_API size_t mdl_linear_workspace_size(int64_t n, int64_t in, int64_t out);
/* b (out) may be NULL. */
MDL_API mdl_status mdl_linear_forward(int64_t n, int64_t in, int64_t out, const float *x,
                                      const float *w, const float *b, float *y,
                                      void *workspace, size_t workspace_bytes);
/* dx (n, in) = dy @ w, overwritten. */
MDL_API mdl_status mdl_linear_backward_data(int64_t n, int64_t in, int64_t out,
                                            const float *dy, const float *w, float *dx,
                                            void *workspace, size_t workspace_bytes);
/* dw (out, in) = or += dy^T @ x; db (out) = or += sum of dy over n (db may be NULL). */
MDL_API mdl_status mdl_linear_backward_weights(int64_t n, int64_t in, int64_t out,
                                               const float *x, const float *dy, float *dw,
                                               float *db, int accumulate,
                                               void *workspace, size_t workspace_bytes);

/* ------------------------------------------------------------------------ */
/* Loss                                                                      */
/* ------------------------------------------------------------------------ */

/* Softmax cross-entropy with integer labels in [0, classes), mean over the
 * batch (log-sum-exp with the row maximum subtracted).  *loss receives the
 * mean; dlogits (n, classes), if not NULL, receives (softmax - onehot) / n
 * (it may be logits itself). */
MDL_API mdl_status mdl_softmax_cross_entropy(int64_t n, int64_t classes, const float *logits,
                                             const int64_t *labels, float *loss,
                                             float *dlogits);

/* ------------------------------------------------------------------------ */
/* Optimizers (one step, in place, PyTorch's torch.optim semantics)          */
/* ------------------------------------------------------------------------ */

/* SGD: g = grad + weight_decay * param; with momentum != 0:
 * buf = g on the first step, else momentum * buf + (1 - dampening) * g;
 * g = nesterov ? g + momentum * buf : buf.  param -= lr * g.
 * momentum_buf (count) may be NULL only when momentum == 0. */
MDL_API mdl_status mdl_sgd_step(int64_t count, float *param, const float *grad,
                                float *momentum_buf, float lr, float momentum,
                                float dampening, float weight_decay, int nesterov,
                                int first_step);
/* Adam (decoupled == 0) and AdamW (decoupled == 1).  step is the 1-based
 * index of this step.  Adam adds weight_decay * param to the gradient;
 * AdamW multiplies param by (1 - lr * weight_decay) first. */
MDL_API mdl_status mdl_adam_step(int64_t count, float *param, const float *grad,
                                 float *exp_avg, float *exp_avg_sq, int64_t step, float lr,
                                 float beta1, float beta2, float eps, float weight_decay,
                                 int decoupled);

#ifdef __cplusplus
}
#endif

#endif /* MINIDL_H */
