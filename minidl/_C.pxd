# Mirror of include/minidl.h, one to one.
from libc.stdint cimport int64_t, uint64_t, uint8_t

cdef extern from "minidl.h" nogil:
    ctypedef enum mdl_status:
        MDL_OK
        MDL_ERR_ARG
        MDL_ERR_WORKSPACE
        MDL_ERR_ALLOC
        MDL_ERR_UNSUPPORTED
        MDL_ERR_DEVICE
    const char *mdl_status_string(mdl_status status)
    const char *mdl_last_error()
    const char *mdl_version()
    void mdl_set_keep_workspace(int keep)
    int mdl_get_keep_workspace()

    mdl_status mdl_set_num_threads(int n)
    int mdl_get_num_threads()
    mdl_status mdl_set_min_parallel_work(int64_t work)
    ctypedef enum mdl_sgemm_b:
        MDL_SGEMM_B_AUTO
        MDL_SGEMM_B_IN_PLACE
        MDL_SGEMM_B_PACKED
    mdl_status mdl_set_sgemm_b(mdl_sgemm_b mode)
    ctypedef enum mdl_simd:
        MDL_SIMD_SCALAR
        MDL_SIMD_AVX2
        MDL_SIMD_AVX512
    mdl_simd mdl_cpu_simd()
    mdl_status mdl_set_simd(mdl_simd level)
    mdl_simd mdl_get_simd()

    size_t mdl_sgemm_workspace_size(int64_t m, int64_t n, int64_t k)
    mdl_status mdl_sgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                         float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                         float beta, float *c, int64_t ldc, void *workspace, size_t workspace_bytes)

    ctypedef struct mdl_conv2d_shape:
        int64_t n, c_in, h, w
        int64_t c_out, kh, kw
        int64_t stride_h, stride_w
        int64_t pad_h, pad_w
    mdl_status mdl_conv2d_output_size(const mdl_conv2d_shape *s, int64_t *h_out, int64_t *w_out)
    ctypedef enum mdl_conv_algo:
        MDL_CONV_AUTO
        MDL_CONV_GEMM
        MDL_CONV_WINOGRAD
    mdl_status mdl_set_conv_algo(mdl_conv_algo algo)
    mdl_conv_algo mdl_get_conv_algo()
    ctypedef enum mdl_winograd_sums:
        MDL_WINOGRAD_SUMS_AUTO
        MDL_WINOGRAD_SUMS_REGISTERS
        MDL_WINOGRAD_SUMS_SGEMM
    mdl_status mdl_set_winograd_sums(mdl_winograd_sums mode)
    size_t mdl_conv2d_workspace_size(const mdl_conv2d_shape *s)
    mdl_status mdl_conv2d_forward(const mdl_conv2d_shape *s, const float *x, const float *w,
                                  const float *bias, float *y, void *workspace, size_t workspace_bytes)
    mdl_status mdl_conv2d_forward_ex(const mdl_conv2d_shape *s, const float *x, const float *w,
                                     const float *bias, int relu, double *channel_sum,
                                     double *channel_sumsq, float *y, void *workspace,
                                     size_t workspace_bytes)
    ctypedef struct mdl_affine:
        const float *scale
        const float *shift
        int relu
    mdl_status mdl_conv2d_forward_fused(const mdl_conv2d_shape *s, const float *x,
                                        const mdl_affine *in_, const float *w, const float *bias,
                                        int relu, double *channel_sum, double *channel_sumsq,
                                        float *y, void *workspace, size_t workspace_bytes)
    mdl_status mdl_conv2d_backward_data(const mdl_conv2d_shape *s, const float *dy, const float *w,
                                        float *dx, void *workspace, size_t workspace_bytes)
    mdl_status mdl_conv2d_backward_data_fused(const mdl_conv2d_shape *s, const float *dy,
                                              const float *w, float *dx, int accumulate,
                                              void *workspace, size_t workspace_bytes)
    mdl_status mdl_conv2d_backward_weights(const mdl_conv2d_shape *s, const float *x, const float *dy,
                                           float *dw, int accumulate, void *workspace,
                                           size_t workspace_bytes)
    mdl_status mdl_conv2d_backward_weights_fused(const mdl_conv2d_shape *s, const float *x,
                                                 const mdl_affine *in_, const float *dy, float *dw,
                                                 int accumulate, void *workspace,
                                                 size_t workspace_bytes)
    mdl_status mdl_conv2d_backward(const mdl_conv2d_shape *s, const float *x, const mdl_affine *in_,
                                   const float *dy, const float *w, float *dx, int accumulate_dx,
                                   float *dw, int accumulate_dw, void *workspace,
                                   size_t workspace_bytes)
    mdl_status mdl_conv2d_backward_bias(const mdl_conv2d_shape *s, const float *dy, float *db,
                                        int accumulate)

    ctypedef struct mdl_pool2d_shape:
        int64_t n, c, h, w
        int64_t kh, kw
        int64_t stride_h, stride_w
        int64_t pad_h, pad_w
        int ceil_mode
    mdl_status mdl_pool2d_output_size(const mdl_pool2d_shape *s, int64_t *h_out, int64_t *w_out)
    mdl_status mdl_max_pool2d_forward(const mdl_pool2d_shape *s, const float *x, float *y)
    mdl_status mdl_max_pool2d_backward(const mdl_pool2d_shape *s, const float *x, const float *dy,
                                       float *dx)
    mdl_status mdl_max_pool2d_forward_fused(const mdl_pool2d_shape *s, const float *x,
                                            const mdl_affine *in_, float *y)
    mdl_status mdl_max_pool2d_backward_fused(const mdl_pool2d_shape *s, const float *x,
                                             const mdl_affine *in_, const float *dy, float *dx)
    mdl_status mdl_max_pool2d_forward_argmax(const mdl_pool2d_shape *s, const float *x,
                                             const mdl_affine *in_, float *y, uint8_t *tap)
    enum: MDL_POOL_NO_TAP
    mdl_status mdl_max_pool2d_forward_argmax_relu(const mdl_pool2d_shape *s, const float *x,
                                                  const mdl_affine *in_, float *y, uint8_t *tap)
    mdl_status mdl_max_pool2d_backward_argmax(const mdl_pool2d_shape *s, const uint8_t *tap,
                                              const float *dy, float *dx)
    mdl_status mdl_avg_pool2d_forward(const mdl_pool2d_shape *s, const float *x, float *y)
    mdl_status mdl_avg_pool2d_backward(const mdl_pool2d_shape *s, const float *dy, float *dx)
    mdl_status mdl_avg_pool2d_backward_relu(const mdl_pool2d_shape *s, const float *x,
                                            const float *dy, float *dx)
    ctypedef enum mdl_pool_kind:
        MDL_POOL_MAX
        MDL_POOL_AVG
    size_t mdl_conv2d_pooled_workspace_size(const mdl_conv2d_shape *s,
                                            const mdl_pool2d_shape *pool)
    mdl_status mdl_conv2d_forward_pooled(const mdl_conv2d_shape *s, const float *x, const float *w,
                                         const float *bias, int relu, const mdl_pool2d_shape *pool,
                                         mdl_pool_kind pool_kind, int pool_relu, float *y,
                                         void *workspace, size_t workspace_bytes)
    mdl_status mdl_global_avg_pool2d_forward(int64_t n, int64_t c, int64_t h, int64_t w,
                                             const float *x, float *y)
    mdl_status mdl_global_avg_pool2d_backward(int64_t n, int64_t c, int64_t h, int64_t w,
                                              const float *dy, float *dx)

    mdl_status mdl_relu_forward(int64_t count, const float *x, float *y)
    mdl_status mdl_relu_backward(int64_t count, const float *x, const float *dy, float *dx)
    mdl_status mdl_add(int64_t count, const float *a, const float *b, float *y)
    mdl_status mdl_affine_add(int64_t n, int64_t c, int64_t hw, const float *a,
                              const mdl_affine *fa, const float *b, const mdl_affine *fb, int relu,
                              float *y)
    mdl_status mdl_dropout_forward(int64_t count, float p, uint64_t seed, const float *x, float *y)
    mdl_status mdl_dropout_backward(int64_t count, float p, uint64_t seed, const float *dy, float *dx)

    mdl_status mdl_batch_norm_forward_train(int64_t n, int64_t c, int64_t hw, const float *x,
                                            const float *gamma, const float *beta, float eps,
                                            float momentum, float *running_mean, float *running_var,
                                            float *y, float *save_mean, float *save_invstd)
    mdl_status mdl_batch_norm_forward_infer(int64_t n, int64_t c, int64_t hw, const float *x,
                                            const float *gamma, const float *beta,
                                            const float *running_mean, const float *running_var,
                                            float eps, float *y)
    mdl_status mdl_batch_norm_backward(int64_t n, int64_t c, int64_t hw, const float *x,
                                       const float *gamma, const float *dy, const float *save_mean,
                                       const float *save_invstd, float *dx, float *dgamma,
                                       float *dbeta, int accumulate)
    mdl_status mdl_batch_norm_stats(int64_t c, int64_t count, const double *channel_sum,
                                    const double *channel_sumsq, const float *gamma,
                                    const float *beta, float eps, float momentum,
                                    float *running_mean, float *running_var, float *save_mean,
                                    float *save_invstd, float *scale, float *shift)
    mdl_status mdl_batch_norm_relu_backward(int64_t n, int64_t c, int64_t hw, const float *x,
                                            const float *gamma, const float *dy,
                                            const float *save_mean, const float *save_invstd,
                                            const float *scale, const float *shift, float *dx,
                                            float *dgamma, float *dbeta, int accumulate)
    mdl_status mdl_batch_norm_add_relu_backward(int64_t n, int64_t c, int64_t hw, const float *s,
                                                const float *b, const mdl_affine *fb,
                                                const float *gamma, const float *beta,
                                                const float *dy, const float *save_invstd,
                                                float *dx, float *db, float *dgamma,
                                                float *dbeta, int accumulate)

    size_t mdl_linear_workspace_size(int64_t n, int64_t in_, int64_t out)
    mdl_status mdl_linear_forward(int64_t n, int64_t in_, int64_t out, const float *x, const float *w,
                                  const float *b, float *y, void *workspace, size_t workspace_bytes)
    mdl_status mdl_linear_backward_data(int64_t n, int64_t in_, int64_t out, const float *dy,
                                        const float *w, float *dx, void *workspace,
                                        size_t workspace_bytes)
    mdl_status mdl_linear_backward_weights(int64_t n, int64_t in_, int64_t out, const float *x,
                                           const float *dy, float *dw, float *db, int accumulate,
                                           void *workspace, size_t workspace_bytes)

    mdl_status mdl_softmax_cross_entropy(int64_t n, int64_t classes, const float *logits,
                                         const int64_t *labels, float *loss, float *dlogits)

    mdl_status mdl_sgd_step(int64_t count, float *param, const float *grad, float *momentum_buf,
                            float lr, float momentum, float dampening, float weight_decay,
                            int nesterov, int first_step)
    mdl_status mdl_adam_step(int64_t count, float *param, const float *grad, float *exp_avg,
                             float *exp_avg_sq, int64_t step, float lr, float beta1, float beta2,
                             float eps, float weight_decay, int decoupled)


# The shape structs from the tuples the bindings take (shared by _C and _cuda).
cdef inline mdl_conv2d_shape conv_shape(tuple s) except *:
    cdef mdl_conv2d_shape cs
    (cs.n, cs.c_in, cs.h, cs.w, cs.c_out, cs.kh, cs.kw,
     cs.stride_h, cs.stride_w, cs.pad_h, cs.pad_w) = s
    return cs


cdef inline mdl_pool2d_shape pool_shape(tuple s) except *:
    cdef mdl_pool2d_shape ps
    (ps.n, ps.c, ps.h, ps.w, ps.kh, ps.kw, ps.stride_h, ps.stride_w,
     ps.pad_h, ps.pad_w, ps.ceil_mode) = s
    return ps
