# Mirror of include/minidl_cuda.h, one to one (minidl.h's types come from _C.pxd).
from libc.stdint cimport int64_t, uint8_t, uint64_t
from minidl._C cimport mdl_status, mdl_conv2d_shape, mdl_pool2d_shape, mdl_affine, mdl_pool_kind

cdef extern from "minidl_cuda.h" nogil:
    ctypedef struct CUstream_st
    ctypedef CUstream_st *mdl_cuda_stream

    mdl_status mdl_cuda_device_count(int *n)
    const char *mdl_cuda_last_error()
    mdl_status mdl_cuda_synchronize(mdl_cuda_stream stream)

    size_t mdl_cuda_sgemm_workspace_size(int64_t m, int64_t n, int64_t k)
    mdl_status mdl_cuda_sgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                              float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                              float beta, float *c, int64_t ldc, void *workspace,
                              size_t workspace_bytes, mdl_cuda_stream stream)

    mdl_status mdl_cuda_conv2d_output_size(const mdl_conv2d_shape *s, int64_t *h_out,
                                           int64_t *w_out)
    size_t mdl_cuda_conv2d_workspace_size(const mdl_conv2d_shape *s)
    mdl_status mdl_cuda_conv2d_forward(const mdl_conv2d_shape *s, const float *x, const float *w,
                                       const float *bias, float *y, void *workspace,
                                       size_t workspace_bytes, mdl_cuda_stream stream)
    mdl_status mdl_cuda_conv2d_forward_ex(const mdl_conv2d_shape *s, const float *x,
                                          const float *w, const float *bias, int relu,
                                          double *channel_sum, double *channel_sumsq, float *y,
                                          void *workspace, size_t workspace_bytes,
                                          mdl_cuda_stream stream)
    size_t mdl_cuda_conv2d_pooled_workspace_size(const mdl_conv2d_shape *s,
                                                 const mdl_pool2d_shape *pool)
    mdl_status mdl_cuda_conv2d_forward_pooled(const mdl_conv2d_shape *s, const float *x,
                                              const float *w, const float *bias, int relu,
                                              const mdl_pool2d_shape *pool,
                                              mdl_pool_kind pool_kind, int pool_relu, float *y,
                                              void *workspace, size_t workspace_bytes,
                                              mdl_cuda_stream stream)
    mdl_status mdl_cuda_conv2d_forward_fused(const mdl_conv2d_shape *s, const float *x,
                                             const mdl_affine *in_, const float *w,
                                             const float *bias, int relu, double *channel_sum,
                                             double *channel_sumsq, float *y, void *workspace,
                                             size_t workspace_bytes, mdl_cuda_stream stream)
    mdl_status mdl_cuda_conv2d_backward_data(const mdl_conv2d_shape *s, const float *dy,
                                             const float *w, float *dx, void *workspace,
                                             size_t workspace_bytes, mdl_cuda_stream stream)
    mdl_status mdl_cuda_conv2d_backward_data_fused(const mdl_conv2d_shape *s, const float *dy,
                                                   const float *w, float *dx, int accumulate,
                                                   void *workspace, size_t workspace_bytes,
                                                   mdl_cuda_stream stream)
    mdl_status mdl_cuda_conv2d_backward_weights(const mdl_conv2d_shape *s, const float *x,
                                                const float *dy, float *dw, int accumulate,
                                                void *workspace, size_t workspace_bytes,
                                                mdl_cuda_stream stream)
    mdl_status mdl_cuda_conv2d_backward_weights_fused(const mdl_conv2d_shape *s, const float *x,
                                                      const mdl_affine *in_, const float *dy,
                                                      float *dw, int accumulate, void *workspace,
                                                      size_t workspace_bytes,
                                                      mdl_cuda_stream stream)
    mdl_status mdl_cuda_conv2d_backward(const mdl_conv2d_shape *s, const float *x,
                                        const mdl_affine *in_, const float *dy, const float *w,
                                        float *dx, int accumulate_dx, float *dw,
                                        int accumulate_dw, void *workspace, size_t workspace_bytes,
                                        mdl_cuda_stream stream)
    mdl_status mdl_cuda_conv2d_backward_bias(const mdl_conv2d_shape *s, const float *dy,
                                             float *db, int accumulate, mdl_cuda_stream stream)

    mdl_status mdl_cuda_pool2d_output_size(const mdl_pool2d_shape *s, int64_t *h_out,
                                           int64_t *w_out)
    mdl_status mdl_cuda_max_pool2d_forward(const mdl_pool2d_shape *s, const float *x, float *y,
                                           mdl_cuda_stream stream)
    mdl_status mdl_cuda_max_pool2d_backward(const mdl_pool2d_shape *s, const float *x,
                                            const float *dy, float *dx, mdl_cuda_stream stream)
    mdl_status mdl_cuda_max_pool2d_forward_fused(const mdl_pool2d_shape *s, const float *x,
                                                 const mdl_affine *in_, float *y,
                                                 mdl_cuda_stream stream)
    mdl_status mdl_cuda_max_pool2d_backward_fused(const mdl_pool2d_shape *s, const float *x,
                                                  const mdl_affine *in_, const float *dy,
                                                  float *dx, mdl_cuda_stream stream)
    mdl_status mdl_cuda_max_pool2d_forward_argmax(const mdl_pool2d_shape *s, const float *x,
                                                  const mdl_affine *in_, float *y, uint8_t *tap,
                                                  mdl_cuda_stream stream)
    mdl_status mdl_cuda_max_pool2d_forward_argmax_relu(const mdl_pool2d_shape *s,
                                                       const float *x, const mdl_affine *in_,
                                                       float *y, uint8_t *tap,
                                                       mdl_cuda_stream stream)
    mdl_status mdl_cuda_max_pool2d_backward_argmax(const mdl_pool2d_shape *s, const uint8_t *tap,
                                                   const float *dy, float *dx,
                                                   mdl_cuda_stream stream)
    mdl_status mdl_cuda_avg_pool2d_forward(const mdl_pool2d_shape *s, const float *x, float *y,
                                           mdl_cuda_stream stream)
    mdl_status mdl_cuda_avg_pool2d_backward(const mdl_pool2d_shape *s, const float *dy,
                                            float *dx, mdl_cuda_stream stream)
    mdl_status mdl_cuda_avg_pool2d_backward_relu(const mdl_pool2d_shape *s, const float *x,
                                                 const float *dy, float *dx,
                                                 mdl_cuda_stream stream)
    mdl_status mdl_cuda_global_avg_pool2d_forward(int64_t n, int64_t c, int64_t h, int64_t w,
                                                  const float *x, float *y,
                                                  mdl_cuda_stream stream)
    mdl_status mdl_cuda_global_avg_pool2d_backward(int64_t n, int64_t c, int64_t h, int64_t w,
                                                   const float *dy, float *dx,
                                                   mdl_cuda_stream stream)

    mdl_status mdl_cuda_relu_forward(int64_t count, const float *x, float *y,
                                     mdl_cuda_stream stream)
    mdl_status mdl_cuda_relu_backward(int64_t count, const float *x, const float *dy, float *dx,
                                      mdl_cuda_stream stream)
    mdl_status mdl_cuda_add(int64_t count, const float *a, const float *b, float *y,
                            mdl_cuda_stream stream)
    mdl_status mdl_cuda_affine_add(int64_t n, int64_t c, int64_t hw, const float *a,
                                   const mdl_affine *fa, const float *b, const mdl_affine *fb,
                                   int relu, float *y, mdl_cuda_stream stream)
    mdl_status mdl_cuda_dropout_forward(int64_t count, float p, uint64_t seed, const float *x,
                                        float *y, mdl_cuda_stream stream)
    mdl_status mdl_cuda_dropout_backward(int64_t count, float p, uint64_t seed, const float *dy,
                                         float *dx, mdl_cuda_stream stream)

    mdl_status mdl_cuda_batch_norm_forward_train(int64_t n, int64_t c, int64_t hw, const float *x,
                                                 const float *gamma, const float *beta, float eps,
                                                 float momentum, float *running_mean,
                                                 float *running_var, float *y, float *save_mean,
                                                 float *save_invstd, mdl_cuda_stream stream)
    mdl_status mdl_cuda_batch_norm_forward_infer(int64_t n, int64_t c, int64_t hw, const float *x,
                                                 const float *gamma, const float *beta,
                                                 const float *running_mean,
                                                 const float *running_var, float eps, float *y,
                                                 mdl_cuda_stream stream)
    mdl_status mdl_cuda_batch_norm_backward(int64_t n, int64_t c, int64_t hw, const float *x,
                                            const float *gamma, const float *dy,
                                            const float *save_mean, const float *save_invstd,
                                            float *dx, float *dgamma, float *dbeta,
                                            int accumulate, mdl_cuda_stream stream)
    mdl_status mdl_cuda_batch_norm_stats(int64_t c, int64_t count, const double *channel_sum,
                                         const double *channel_sumsq, const float *gamma,
                                         const float *beta, float eps, float momentum,
                                         float *running_mean, float *running_var,
                                         float *save_mean, float *save_invstd, float *scale,
                                         float *shift, mdl_cuda_stream stream)
    mdl_status mdl_cuda_batch_norm_relu_backward(int64_t n, int64_t c, int64_t hw,
                                                 const float *x, const float *gamma,
                                                 const float *dy, const float *save_mean,
                                                 const float *save_invstd, const float *scale,
                                                 const float *shift, float *dx, float *dgamma,
                                                 float *dbeta, int accumulate,
                                                 mdl_cuda_stream stream)
    mdl_status mdl_cuda_batch_norm_add_relu_backward(int64_t n, int64_t c, int64_t hw,
                                                     const float *s, const float *b,
                                                     const mdl_affine *fb, const float *gamma,
                                                     const float *beta, const float *dy,
                                                     const float *save_invstd, float *dx,
                                                     float *db, float *dgamma, float *dbeta,
                                                     int accumulate, mdl_cuda_stream stream)

    size_t mdl_cuda_linear_workspace_size(int64_t n, int64_t in_, int64_t out)
    mdl_status mdl_cuda_linear_forward(int64_t n, int64_t in_, int64_t out, const float *x,
                                       const float *w, const float *b, float *y, void *workspace,
                                       size_t workspace_bytes, mdl_cuda_stream stream)
    mdl_status mdl_cuda_linear_backward_data(int64_t n, int64_t in_, int64_t out,
                                             const float *dy, const float *w, float *dx,
                                             void *workspace, size_t workspace_bytes,
                                             mdl_cuda_stream stream)
    mdl_status mdl_cuda_linear_backward_weights(int64_t n, int64_t in_, int64_t out,
                                                const float *x, const float *dy, float *dw,
                                                float *db, int accumulate, void *workspace,
                                                size_t workspace_bytes, mdl_cuda_stream stream)

    mdl_status mdl_cuda_softmax_cross_entropy(int64_t n, int64_t classes, const float *logits,
                                              const int64_t *labels, float *loss, float *dlogits,
                                              mdl_cuda_stream stream)

    mdl_status mdl_cuda_sgd_step(int64_t count, float *param, const float *grad,
                                 float *momentum_buf, float lr, float momentum, float dampening,
                                 float weight_decay, int nesterov, int first_step,
                                 mdl_cuda_stream stream)
    mdl_status mdl_cuda_adam_step(int64_t count, float *param, const float *grad,
                                  float *exp_avg, float *exp_avg_sq, int64_t step, float lr,
                                  float beta1, float beta2, float eps, float weight_decay,
                                  int decoupled, mdl_cuda_stream stream)
