/*
 * minidl_cuda.h -- the public CUDA C API of minidl: GPU twins of the kernels
 * in minidl.h.
 *
 * Overview
 * --------
 * For every kernel mdl_X of minidl.h there is an mdl_cuda_X here with the
 * same arguments in the same order, plus a final stream argument, and the
 * same meaning (accumulate flags, NULL bias, ceil-mode pooling, BatchNorm's
 * running statistics, optimizer rules, the dropout mask bit for bit):
 *
 *     mdl_relu_forward(count, x, y)
 *     mdl_cuda_relu_forward(count, x, y, stream)
 *
 * The kernels are written for minidl (no cuDNN, cuBLAS or CUTLASS): a tiled
 * SGEMM with register blocking, convolutions as implicit GEMMs on it, and
 * warp-shuffle reductions in a fixed order, so that every result is
 * reproducible run to run (no floating-point atomics).
 *
 * Conventions
 * -----------
 *  - Tensor pointers (x, w, y, workspace, ...) are device pointers; shape
 *    structs (mdl_conv2d_shape, mdl_pool2d_shape), mdl_affine structs (whose
 *    scale and shift are device pointers) and output-size pointers are host
 *    pointers, read or written before the call returns.
 *  - Every call is asynchronous on `stream` (NULL: the default stream) and
 *    returns an mdl_status: arguments are checked on the host before anything
 *    is launched (MDL_ERR_ARG with a message naming the argument, as in
 *    minidl.h), and a failed launch is reported (MDL_ERR_DEVICE, or
 *    MDL_ERR_ALLOC).  mdl_cuda_last_error() returns the message (per host
 *    thread).  Errors in kernels that already ran show up at the next
 *    synchronisation (mdl_cuda_synchronize) or later call.
 *  - The kernels allocate nothing.  Functions that need scratch memory take
 *    (workspace, workspace_bytes), device memory of the size their
 *    *_workspace_size() function returns; a non-NULL workspace that is too
 *    small is an error (MDL_ERR_WORKSPACE).  Unlike the CPU library, a NULL
 *    workspace allocates nothing: the call takes a slower path that needs
 *    none (convolution's weight gradient without split-K, its forward's channel
 *    sums in a pass over y).
 *  - Gradients of inputs are overwritten; gradients of parameters are
 *    overwritten (accumulate 0) or added to (accumulate 1), as in minidl.h.
 *  - Sizes are int64_t.  The GEMM-based kernels (SGEMM, convolution, linear)
 *    need every GEMM dimension below 2^30 (MDL_ERR_UNSUPPORTED otherwise).
 *  - The device is the calling thread's current CUDA device; the library
 *    uses the CUDA runtime (linked statically into libminidl_cuda), which
 *    works in the device's primary context, so a program using the driver
 *    API (or pycuda) must make the primary context current:
 *    cuDevicePrimaryCtxRetain + cuCtxPushCurrent.
 *  - mdl_cuda_stream is the same type as cudaStream_t and CUstream, so no
 *    CUDA header is needed to use this one.
 *
 * Differences from the CPU functions
 * ----------------------------------
 *  - mdl_cuda_softmax_cross_entropy writes the loss to device memory, and
 *    cannot check the labels (device memory) on the host: a label outside
 *    [0, classes) makes the loss and that row of dlogits NaN.
 *  - mdl_cuda_batch_norm_add_relu_backward cannot check gamma * save_invstd
 *    (device memory) on the host: a channel whose gamma or save_invstd is zero
 *    or not finite gets NaN in dx.
 *  - mdl_cuda_max_pool2d_backward_argmax cannot check the taps (device memory)
 *    on the host: a tap that names no element of the input (one that does not
 *    come from mdl_cuda_max_pool2d_forward_argmax with the same shape) adds
 *    nothing to dx.
 *  - The size helpers (*_workspace_size, *_output_size) run on the host and
 *    take no stream.
 *  - Results agree with the CPU kernels to float32 rounding (sums are taken
 *    in another order), except dropout, whose mask and output are bit for bit
 *    those of mdl_dropout_forward for the same seed.
 *
 * Example
 * -------
 *     #include <minidl_cuda.h>
 *     // a, b, c: device pointers (cudaMalloc), 2x3, 3x2 and 2x2 floats
 *     if (mdl_cuda_sgemm(0, 0, 2, 2, 3, 1.0f, a, 3, b, 2, 0.0f, c, 2, NULL, 0, NULL) != MDL_OK ||
 *         mdl_cuda_synchronize(NULL) != MDL_OK)
 *         fprintf(stderr, "minidl: %s\n", mdl_cuda_last_error());
 *
 * Link with -lminidl_cuda (it needs only the NVIDIA driver at run time, not
 * the CUDA toolkit); the header and library are installed next to minidl.h
 * and libminidl by `make install` and by the Python package when it was built
 * with CUDA (`python -m minidl --cflags --libs` gives the directories).
 */
#ifndef MINIDL_CUDA_H
#define MINIDL_CUDA_H

#include "minidl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The same type as cudaStream_t / CUstream; NULL is the default stream. */
typedef struct CUstream_st *mdl_cuda_stream;

/* ------------------------------------------------------------------------ */
/* Devices and errors                                                        */
/* ------------------------------------------------------------------------ */

/* *n = the number of CUDA devices.  No driver or no device gives *n = 0 and
 * MDL_OK, with the reason in mdl_cuda_last_error(). */
MDL_API mdl_status mdl_cuda_device_count(int *n);
/* The message of the last failed call on this host thread ("" if none). */
MDL_API const char *mdl_cuda_last_error(void);
/* Wait for the work queued on `stream`; reports errors of kernels that ran. */
MDL_API mdl_status mdl_cuda_synchronize(mdl_cuda_stream stream);

/* ------------------------------------------------------------------------ */
/* SGEMM: C[m,n] = alpha * op(A) @ op(B) + beta * C, row-major (see minidl.h) */
/* ------------------------------------------------------------------------ */

/* 0: the CUDA SGEMM needs no workspace. */
MDL_API size_t mdl_cuda_sgemm_workspace_size(int64_t m, int64_t n, int64_t k);
MDL_API mdl_status mdl_cuda_sgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                                  float alpha, const float *a, int64_t lda,
                                  const float *b, int64_t ldb,
                                  float beta, float *c, int64_t ldc,
                                  void *workspace, size_t workspace_bytes,
                                  mdl_cuda_stream stream);

/* ------------------------------------------------------------------------ */
/* 2-D convolution, implicit GEMM (no im2col buffer)                         */
/* ------------------------------------------------------------------------ */

MDL_API mdl_status mdl_cuda_conv2d_output_size(const mdl_conv2d_shape *s,
                                               int64_t *h_out, int64_t *w_out);
/* Bytes of device workspace for the split-K partial sums of backward_weights and
 * for the forward's channel sums, a pair of doubles for each channel and tile of the
 * output from the workspace's first 8-byte boundary (the larger of the two;
 * backward_data needs none). */
MDL_API size_t mdl_cuda_conv2d_workspace_size(const mdl_conv2d_shape *s);
/* y = conv(x, w) + bias; bias (c_out) may be NULL. */
MDL_API mdl_status mdl_cuda_conv2d_forward(const mdl_conv2d_shape *s, const float *x,
                                           const float *w, const float *bias, float *y,
                                           void *workspace, size_t workspace_bytes,
                                           mdl_cuda_stream stream);
/* The forward with bias, ReLU and float64 channel sums (see mdl_conv2d_forward_ex);
 * channel_sum and channel_sumsq are device pointers or NULL.  With a workspace the
 * sums are taken in the kernel's epilogue, each output tile's while it is in
 * registers, then added up in a fixed order; without one, in a pass over y. */
MDL_API mdl_status mdl_cuda_conv2d_forward_ex(const mdl_conv2d_shape *s, const float *x,
                                              const float *w, const float *bias, int relu,
                                              double *channel_sum, double *channel_sumsq,
                                              float *y, void *workspace, size_t workspace_bytes,
                                              mdl_cuda_stream stream);
/* forward_ex of x read through `in` (see mdl_conv2d_forward_fused; NULL: x as it
 * is): `in` is a host pointer, its scale and shift device pointers (c_in each).
 * Needs no more workspace than the forward (mdl_cuda_conv2d_workspace_size). */
MDL_API mdl_status mdl_cuda_conv2d_forward_fused(const mdl_conv2d_shape *s, const float *x,
                                                 const mdl_affine *in, const float *w,
                                                 const float *bias, int relu,
                                                 double *channel_sum, double *channel_sumsq,
                                                 float *y, void *workspace,
                                                 size_t workspace_bytes, mdl_cuda_stream stream);
/* The convolution and its pooling (see mdl_conv2d_forward_pooled): here the
 * convolution's output goes to the workspace, which must be given and hold
 * mdl_cuda_conv2d_pooled_workspace_size bytes (n * c_out * h_out * w_out floats),
 * then the pooling and the ReLU read it from there. */
MDL_API size_t mdl_cuda_conv2d_pooled_workspace_size(const mdl_conv2d_shape *s,
                                                     const mdl_pool2d_shape *pool);
MDL_API mdl_status mdl_cuda_conv2d_forward_pooled(const mdl_conv2d_shape *s, const float *x,
                                                  const float *w, const float *bias, int relu,
                                                  const mdl_pool2d_shape *pool,
                                                  mdl_pool_kind pool_kind, int pool_relu,
                                                  float *y, void *workspace,
                                                  size_t workspace_bytes, mdl_cuda_stream stream);
/* dx = conv_transpose(dy, w), overwritten. */
MDL_API mdl_status mdl_cuda_conv2d_backward_data(const mdl_conv2d_shape *s, const float *dy,
                                                 const float *w, float *dx,
                                                 void *workspace, size_t workspace_bytes,
                                                 mdl_cuda_stream stream);
/* dx = or += (accumulate non-zero) conv_transpose(dy, w) (see
 * mdl_conv2d_backward_data_fused): the sum made in the GEMM's store, with the same
 * workspace as backward_data. */
MDL_API mdl_status mdl_cuda_conv2d_backward_data_fused(const mdl_conv2d_shape *s,
                                                       const float *dy, const float *w, float *dx,
                                                       int accumulate, void *workspace,
                                                       size_t workspace_bytes,
                                                       mdl_cuda_stream stream);
/* dw (c_out, c_in, kh, kw) = or += correlation of x with dy. */
MDL_API mdl_status mdl_cuda_conv2d_backward_weights(const mdl_conv2d_shape *s, const float *x,
                                                    const float *dy, float *dw, int accumulate,
                                                    void *workspace, size_t workspace_bytes,
                                                    mdl_cuda_stream stream);
/* backward_weights of x read through `in` (as in mdl_cuda_conv2d_forward_fused),
 * with the same workspace. */
MDL_API mdl_status mdl_cuda_conv2d_backward_weights_fused(const mdl_conv2d_shape *s,
                                                          const float *x, const mdl_affine *in,
                                                          const float *dy, float *dw,
                                                          int accumulate, void *workspace,
                                                          size_t workspace_bytes,
                                                          mdl_cuda_stream stream);
/* Both gradients in one call (mdl_conv2d_backward's contract), with the same
 * workspace. */
MDL_API mdl_status mdl_cuda_conv2d_backward(const mdl_conv2d_shape *s, const float *x,
                                            const mdl_affine *in, const float *dy,
                                            const float *w, float *dx, int accumulate_dx,
                                            float *dw, int accumulate_dw, void *workspace,
                                            size_t workspace_bytes, mdl_cuda_stream stream);
/* db (c_out) = or += sum of dy over n, h_out, w_out. */
MDL_API mdl_status mdl_cuda_conv2d_backward_bias(const mdl_conv2d_shape *s, const float *dy,
                                                 float *db, int accumulate,
                                                 mdl_cuda_stream stream);

/* ------------------------------------------------------------------------ */
/* Pooling (PyTorch's output sizes and semantics, as in minidl.h)            */
/* ------------------------------------------------------------------------ */

MDL_API mdl_status mdl_cuda_pool2d_output_size(const mdl_pool2d_shape *s,
                                               int64_t *h_out, int64_t *w_out);
MDL_API mdl_status mdl_cuda_max_pool2d_forward(const mdl_pool2d_shape *s, const float *x,
                                               float *y, mdl_cuda_stream stream);
/* dx overwritten; each dy goes to its window's first maximum (recomputed). */
MDL_API mdl_status mdl_cuda_max_pool2d_backward(const mdl_pool2d_shape *s, const float *x,
                                                const float *dy, float *dx,
                                                mdl_cuda_stream stream);
/* The max pooling of x read through `in` (see mdl_max_pool2d_forward_fused; NULL: x as
 * it is), forward and backward: `in` is a host pointer, its scale and shift device
 * pointers (c each); dx overwritten, the gradient with respect to the mapped input. */
MDL_API mdl_status mdl_cuda_max_pool2d_forward_fused(const mdl_pool2d_shape *s, const float *x,
                                                     const mdl_affine *in, float *y,
                                                     mdl_cuda_stream stream);
MDL_API mdl_status mdl_cuda_max_pool2d_backward_fused(const mdl_pool2d_shape *s, const float *x,
                                                      const mdl_affine *in, const float *dy,
                                                      float *dx, mdl_cuda_stream stream);
/* The max pooling of x read through `in` (NULL: x as it is; see
 * mdl_max_pool2d_forward_argmax), with tap (n, c, h_out, w_out) = the tap of each
 * window's first maximum, ky * kw + kx from the window's unclipped top-left corner
 * (windows of at most 256 elements). */
MDL_API mdl_status mdl_cuda_max_pool2d_forward_argmax(const mdl_pool2d_shape *s, const float *x,
                                                      const mdl_affine *in, float *y,
                                                      uint8_t *tap, mdl_cuda_stream stream);
/* The same followed by a ReLU (mdl_max_pool2d_forward_argmax_relu: MDL_POOL_NO_TAP where
 * the maximum is not above 0; windows of at most 255 elements). */
MDL_API mdl_status mdl_cuda_max_pool2d_forward_argmax_relu(const mdl_pool2d_shape *s,
                                                           const float *x, const mdl_affine *in,
                                                           float *y, uint8_t *tap,
                                                           mdl_cuda_stream stream);
/* dx overwritten; each dy goes to the element its tap names (no x read), MDL_POOL_NO_TAP
 * to none.  The taps must come from mdl_cuda_max_pool2d_forward_argmax(_relu) with the
 * same shape. */
MDL_API mdl_status mdl_cuda_max_pool2d_backward_argmax(const mdl_pool2d_shape *s,
                                                       const uint8_t *tap, const float *dy,
                                                       float *dx, mdl_cuda_stream stream);
MDL_API mdl_status mdl_cuda_avg_pool2d_forward(const mdl_pool2d_shape *s, const float *x,
                                               float *y, mdl_cuda_stream stream);
MDL_API mdl_status mdl_cuda_avg_pool2d_backward(const mdl_pool2d_shape *s, const float *dy,
                                                float *dx, mdl_cuda_stream stream);
MDL_API mdl_status mdl_cuda_avg_pool2d_backward_relu(const mdl_pool2d_shape *s, const float *x,
                                                     const float *dy, float *dx,
                                                     mdl_cuda_stream stream);
MDL_API mdl_status mdl_cuda_global_avg_pool2d_forward(int64_t n, int64_t c, int64_t h,
                                                      int64_t w, const float *x, float *y,
                                                      mdl_cuda_stream stream);
MDL_API mdl_status mdl_cuda_global_avg_pool2d_backward(int64_t n, int64_t c, int64_t h,
                                                       int64_t w, const float *dy, float *dx,
                                                       mdl_cuda_stream stream);

/* ------------------------------------------------------------------------ */
/* Elementwise: ReLU, add, dropout                                           */
/* ------------------------------------------------------------------------ */

MDL_API mdl_status mdl_cuda_relu_forward(int64_t count, const float *x, float *y,
                                         mdl_cuda_stream stream);
MDL_API mdl_status mdl_cuda_relu_backward(int64_t count, const float *x, const float *dy,
                                          float *dx, mdl_cuda_stream stream);
MDL_API mdl_status mdl_cuda_add(int64_t count, const float *a, const float *b, float *y,
                                mdl_cuda_stream stream);
/* y = act(fa(a) + fb(b)) over (n, c, hw) (see mdl_affine_add); fa and fb are host
 * pointers (or NULL), their scale and shift device pointers (c each). */
MDL_API mdl_status mdl_cuda_affine_add(int64_t n, int64_t c, int64_t hw, const float *a,
                                       const mdl_affine *fa, const float *b,
                                       const mdl_affine *fb, int relu, float *y,
                                       mdl_cuda_stream stream);
/* The same counter-based mask as mdl_dropout_forward: bit-identical output. */
MDL_API mdl_status mdl_cuda_dropout_forward(int64_t count, float p, uint64_t seed,
                                            const float *x, float *y, mdl_cuda_stream stream);
MDL_API mdl_status mdl_cuda_dropout_backward(int64_t count, float p, uint64_t seed,
                                             const float *dy, float *dx,
                                             mdl_cuda_stream stream);

/* ------------------------------------------------------------------------ */
/* BatchNorm2d over (n, c, hw), one block per channel                        */
/* ------------------------------------------------------------------------ */

MDL_API mdl_status mdl_cuda_batch_norm_forward_train(int64_t n, int64_t c, int64_t hw,
                                                     const float *x, const float *gamma,
                                                     const float *beta, float eps,
                                                     float momentum, float *running_mean,
                                                     float *running_var, float *y,
                                                     float *save_mean, float *save_invstd,
                                                     mdl_cuda_stream stream);
MDL_API mdl_status mdl_cuda_batch_norm_forward_infer(int64_t n, int64_t c, int64_t hw,
                                                     const float *x, const float *gamma,
                                                     const float *beta,
                                                     const float *running_mean,
                                                     const float *running_var, float eps,
                                                     float *y, mdl_cuda_stream stream);
MDL_API mdl_status mdl_cuda_batch_norm_backward(int64_t n, int64_t c, int64_t hw,
                                                const float *x, const float *gamma,
                                                const float *dy, const float *save_mean,
                                                const float *save_invstd, float *dx,
                                                float *dgamma, float *dbeta, int accumulate,
                                                mdl_cuda_stream stream);
/* Statistics and the affine map from float64 channel sums (device pointers), one
 * thread per channel (see mdl_batch_norm_stats). */
MDL_API mdl_status mdl_cuda_batch_norm_stats(int64_t c, int64_t count, const double *channel_sum,
                                             const double *channel_sumsq, const float *gamma,
                                             const float *beta, float eps, float momentum,
                                             float *running_mean, float *running_var,
                                             float *save_mean, float *save_invstd, float *scale,
                                             float *shift, mdl_cuda_stream stream);
/* batch_norm_backward with dy masked by x * scale + shift > 0 (the ReLU after it). */
MDL_API mdl_status mdl_cuda_batch_norm_relu_backward(int64_t n, int64_t c, int64_t hw,
                                                     const float *x, const float *gamma,
                                                     const float *dy, const float *save_mean,
                                                     const float *save_invstd,
                                                     const float *scale, const float *shift,
                                                     float *dx, float *dgamma, float *dbeta,
                                                     int accumulate, mdl_cuda_stream stream);
/* The backward of max(BatchNorm(x) + fb(b), 0) with x reconstructed from the sum s
 * before the ReLU (see mdl_batch_norm_add_relu_backward); fb is a host pointer (or
 * NULL), its scale and shift device pointers (c each).  gamma * save_invstd is not
 * checked (device memory): see the overview. */
MDL_API mdl_status mdl_cuda_batch_norm_add_relu_backward(int64_t n, int64_t c, int64_t hw,
                                                         const float *s, const float *b,
                                                         const mdl_affine *fb,
                                                         const float *gamma, const float *beta,
                                                         const float *dy,
                                                         const float *save_invstd, float *dx,
                                                         float *db, float *dgamma, float *dbeta,
                                                         int accumulate,
                                                         mdl_cuda_stream stream);

/* ------------------------------------------------------------------------ */
/* Fully connected: y (n, out) = x (n, in) @ w^T + b                         */
/* ------------------------------------------------------------------------ */

/* 0: the CUDA linear layer needs no workspace. */
MDL_API size_t mdl_cuda_linear_workspace_size(int64_t n, int64_t in, int64_t out);
MDL_API mdl_status mdl_cuda_linear_forward(int64_t n, int64_t in, int64_t out, const float *x,
                                           const float *w, const float *b, float *y,
                                           void *workspace, size_t workspace_bytes,
                                           mdl_cuda_stream stream);
MDL_API mdl_status mdl_cuda_linear_backward_data(int64_t n, int64_t in, int64_t out,
                                                 const float *dy, const float *w, float *dx,
                                                 void *workspace, size_t workspace_bytes,
                                                 mdl_cuda_stream stream);
MDL_API mdl_status mdl_cuda_linear_backward_weights(int64_t n, int64_t in, int64_t out,
                                                    const float *x, const float *dy, float *dw,
                                                    float *db, int accumulate,
                                                    void *workspace, size_t workspace_bytes,
                                                    mdl_cuda_stream stream);

/* ------------------------------------------------------------------------ */
/* Loss                                                                      */
/* ------------------------------------------------------------------------ */

/* As mdl_softmax_cross_entropy; loss points to one float in device memory;
 * labels (n int64, device) are not range-checked: see the overview. */
MDL_API mdl_status mdl_cuda_softmax_cross_entropy(int64_t n, int64_t classes,
                                                  const float *logits, const int64_t *labels,
                                                  float *loss, float *dlogits,
                                                  mdl_cuda_stream stream);

/* ------------------------------------------------------------------------ */
/* Optimizers (PyTorch's torch.optim rules, as in minidl.h)                  */
/* ------------------------------------------------------------------------ */

MDL_API mdl_status mdl_cuda_sgd_step(int64_t count, float *param, const float *grad,
                                     float *momentum_buf, float lr, float momentum,
                                     float dampening, float weight_decay, int nesterov,
                                     int first_step, mdl_cuda_stream stream);
MDL_API mdl_status mdl_cuda_adam_step(int64_t count, float *param, const float *grad,
                                      float *exp_avg, float *exp_avg_sq, int64_t step,
                                      float lr, float beta1, float beta2, float eps,
                                      float weight_decay, int decoupled,
                                      mdl_cuda_stream stream);

#ifdef __cplusplus
}
#endif

#endif /* MINIDL_CUDA_H */
