# cython: language_level=3
"""Thin bindings to the C core: flat float32 buffers in, status checked, no logic.

Validation, shapes and output allocation live in minidl/ops.py.  Every kernel
call releases the GIL.  Arrays are 1-D C-contiguous views (``a.reshape(-1)``);
None stands for a NULL pointer where the C API allows one.
"""
from libc.stdint cimport int64_t, uint64_t, uint8_t


class MinidlError(RuntimeError):
    """A failure reported by the C core that is not an argument error."""


cdef int check(mdl_status st) except -1:
    if st == MDL_OK:
        return 0
    msg = mdl_last_error().decode("utf-8", "replace")
    if st == MDL_ERR_ARG or st == MDL_ERR_WORKSPACE:
        raise ValueError(msg)
    if st == MDL_ERR_ALLOC:
        raise MemoryError(msg)
    raise MinidlError(f"{mdl_status_string(st).decode()}: {msg}")


cdef inline const float *cptr(const float[::1] a) noexcept nogil:
    return &a[0] if a is not None and a.shape[0] > 0 else NULL


cdef inline float *mptr(float[::1] a) noexcept nogil:
    return &a[0] if a is not None and a.shape[0] > 0 else NULL


cdef inline void *wptr(float[::1] ws) noexcept nogil:
    return <void *>&ws[0] if ws is not None and ws.shape[0] > 0 else NULL


cdef inline size_t wbytes(float[::1] ws) noexcept nogil:
    return <size_t>ws.shape[0] * sizeof(float) if ws is not None else 0


cdef inline const mdl_affine *affine(mdl_affine *f, const float[::1] scale,
                                     const float[::1] shift, bint relu) noexcept:
    """f filled in, or NULL for the identity (no scale, no ReLU)."""
    f.scale, f.shift, f.relu = cptr(scale), cptr(shift), relu
    return f if f.scale != NULL or relu else NULL


# ---- runtime -------------------------------------------------------------------

def version():
    return mdl_version().decode()


def set_num_threads(int n):
    check(mdl_set_num_threads(n))


def get_num_threads():
    return mdl_get_num_threads()


def set_min_parallel_work(int64_t work):
    check(mdl_set_min_parallel_work(work))


SIMD_LEVELS = {"scalar": MDL_SIMD_SCALAR, "avx2": MDL_SIMD_AVX2, "avx512": MDL_SIMD_AVX512}
_SIMD_NAMES = {v: k for k, v in SIMD_LEVELS.items()}


def cpu_simd():
    """The best kernel level of this CPU: "scalar", "avx2" or "avx512"."""
    return _SIMD_NAMES[mdl_cpu_simd()]


def set_simd(str level):
    if level not in SIMD_LEVELS:
        raise ValueError(f"simd level must be one of {sorted(SIMD_LEVELS)}, got {level!r}")
    check(mdl_set_simd(SIMD_LEVELS[level]))


def get_simd():
    return _SIMD_NAMES[mdl_get_simd()]


# ---- gemm ---------------------------------------------------------------------

def sgemm(bint trans_a, bint trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float[::1] a, int64_t lda, const float[::1] b, int64_t ldb, float beta,
          float[::1] c, int64_t ldc, float[::1] ws=None):
    cdef mdl_status st
    with nogil:
        st = mdl_sgemm(trans_a, trans_b, m, n, k, alpha, cptr(a), lda, cptr(b), ldb, beta,
                       mptr(c), ldc, wptr(ws), wbytes(ws))
    check(st)


def sgemm_workspace_size(int64_t m, int64_t n, int64_t k):
    return mdl_sgemm_workspace_size(m, n, k)


# ---- conv ---------------------------------------------------------------------

def conv2d_output_size(tuple shape):
    cdef mdl_conv2d_shape cs = conv_shape(shape)
    cdef int64_t ho = 0, wo = 0
    check(mdl_conv2d_output_size(&cs, &ho, &wo))
    return ho, wo


CONV_ALGOS = {"auto": MDL_CONV_AUTO, "gemm": MDL_CONV_GEMM, "winograd": MDL_CONV_WINOGRAD}


def set_conv_algo(str algo):
    if algo not in CONV_ALGOS:
        raise ValueError(f"conv algorithm must be one of {sorted(CONV_ALGOS)}, got {algo!r}")
    check(mdl_set_conv_algo(CONV_ALGOS[algo]))


def get_conv_algo():
    cdef mdl_conv_algo a = mdl_get_conv_algo()
    return next(k for k, v in CONV_ALGOS.items() if v == a)


def conv2d_workspace_size(tuple shape):
    cdef mdl_conv2d_shape cs = conv_shape(shape)
    return mdl_conv2d_workspace_size(&cs)


def conv2d_forward(tuple shape, const float[::1] x, const float[::1] w, const float[::1] bias,
                   float[::1] y, float[::1] ws=None):
    cdef mdl_conv2d_shape cs = conv_shape(shape)
    cdef mdl_status st
    with nogil:
        st = mdl_conv2d_forward(&cs, cptr(x), cptr(w), cptr(bias), mptr(y), wptr(ws), wbytes(ws))
    check(st)


def conv2d_forward_ex(tuple shape, const float[::1] x, const float[::1] w, const float[::1] bias,
                      bint relu, double[::1] channel_sum, double[::1] channel_sumsq,
                      float[::1] y, float[::1] ws=None):
    cdef mdl_conv2d_shape cs = conv_shape(shape)
    cdef mdl_status st
    cdef double *sums = &channel_sum[0] if channel_sum is not None else NULL
    cdef double *sumsq = &channel_sumsq[0] if channel_sumsq is not None else NULL
    with nogil:
        st = mdl_conv2d_forward_ex(&cs, cptr(x), cptr(w), cptr(bias), relu, sums, sumsq, mptr(y),
                                   wptr(ws), wbytes(ws))
    check(st)


def conv2d_forward_fused(tuple shape, const float[::1] x, const float[::1] in_scale,
                         const float[::1] in_shift, bint in_relu, const float[::1] w,
                         const float[::1] bias, bint relu, double[::1] channel_sum,
                         double[::1] channel_sumsq, float[::1] y, float[::1] ws=None):
    cdef mdl_conv2d_shape cs = conv_shape(shape)
    cdef mdl_affine f
    cdef const mdl_affine *fp = affine(&f, in_scale, in_shift, in_relu)
    cdef mdl_status st
    cdef double *sums = &channel_sum[0] if channel_sum is not None else NULL
    cdef double *sumsq = &channel_sumsq[0] if channel_sumsq is not None else NULL
    with nogil:
        st = mdl_conv2d_forward_fused(&cs, cptr(x), fp, cptr(w), cptr(bias), relu, sums, sumsq,
                                      mptr(y), wptr(ws), wbytes(ws))
    check(st)


def conv2d_pooled_workspace_size(tuple shape, tuple pool):
    cdef mdl_conv2d_shape cs = conv_shape(shape)
    cdef mdl_pool2d_shape ps = pool_shape(pool)
    return mdl_conv2d_pooled_workspace_size(&cs, &ps)


def conv2d_forward_pooled(tuple shape, const float[::1] x, const float[::1] w,
                          const float[::1] bias, bint relu, tuple pool, bint pool_avg,
                          bint pool_relu, float[::1] y, float[::1] ws=None):
    cdef mdl_conv2d_shape cs = conv_shape(shape)
    cdef mdl_pool2d_shape ps = pool_shape(pool)
    cdef mdl_pool_kind kind = MDL_POOL_AVG if pool_avg else MDL_POOL_MAX
    cdef mdl_status st
    with nogil:
        st = mdl_conv2d_forward_pooled(&cs, cptr(x), cptr(w), cptr(bias), relu, &ps, kind,
                                       pool_relu, mptr(y), wptr(ws), wbytes(ws))
    check(st)


def conv2d_backward_data(tuple shape, const float[::1] dy, const float[::1] w, float[::1] dx,
                         float[::1] ws=None):
    cdef mdl_conv2d_shape cs = conv_shape(shape)
    cdef mdl_status st
    with nogil:
        st = mdl_conv2d_backward_data(&cs, cptr(dy), cptr(w), mptr(dx), wptr(ws), wbytes(ws))
    check(st)


def conv2d_backward_data_fused(tuple shape, const float[::1] dy, const float[::1] w,
                               float[::1] dx, bint accumulate, float[::1] ws=None):
    cdef mdl_conv2d_shape cs = conv_shape(shape)
    cdef mdl_status st
    with nogil:
        st = mdl_conv2d_backward_data_fused(&cs, cptr(dy), cptr(w), mptr(dx), accumulate,
                                            wptr(ws), wbytes(ws))
    check(st)


def conv2d_backward_weights(tuple shape, const float[::1] x, const float[::1] dy, float[::1] dw,
                            bint accumulate=False, float[::1] ws=None):
    cdef mdl_conv2d_shape cs = conv_shape(shape)
    cdef mdl_status st
    with nogil:
        st = mdl_conv2d_backward_weights(&cs, cptr(x), cptr(dy), mptr(dw), accumulate,
                                         wptr(ws), wbytes(ws))
    check(st)


def conv2d_backward_weights_fused(tuple shape, const float[::1] x, const float[::1] in_scale,
                                  const float[::1] in_shift, bint in_relu, const float[::1] dy,
                                  float[::1] dw, bint accumulate, float[::1] ws=None):
    cdef mdl_conv2d_shape cs = conv_shape(shape)
    cdef mdl_affine f
    cdef const mdl_affine *fp = affine(&f, in_scale, in_shift, in_relu)
    cdef mdl_status st
    with nogil:
        st = mdl_conv2d_backward_weights_fused(&cs, cptr(x), fp, cptr(dy), mptr(dw), accumulate,
                                               wptr(ws), wbytes(ws))
    check(st)


def conv2d_backward_bias(tuple shape, const float[::1] dy, float[::1] db, bint accumulate=False):
    cdef mdl_conv2d_shape cs = conv_shape(shape)
    cdef mdl_status st
    with nogil:
        st = mdl_conv2d_backward_bias(&cs, cptr(dy), mptr(db), accumulate)
    check(st)


# ---- pooling ------------------------------------------------------------------

def pool2d_output_size(tuple shape):
    cdef mdl_pool2d_shape ps = pool_shape(shape)
    cdef int64_t ho = 0, wo = 0
    check(mdl_pool2d_output_size(&ps, &ho, &wo))
    return ho, wo


def max_pool2d_forward(tuple shape, const float[::1] x, float[::1] y):
    cdef mdl_pool2d_shape ps = pool_shape(shape)
    cdef mdl_status st
    with nogil:
        st = mdl_max_pool2d_forward(&ps, cptr(x), mptr(y))
    check(st)


def max_pool2d_backward(tuple shape, const float[::1] x, const float[::1] dy, float[::1] dx):
    cdef mdl_pool2d_shape ps = pool_shape(shape)
    cdef mdl_status st
    with nogil:
        st = mdl_max_pool2d_backward(&ps, cptr(x), cptr(dy), mptr(dx))
    check(st)


def max_pool2d_forward_fused(tuple shape, const float[::1] x, const float[::1] in_scale,
                             const float[::1] in_shift, bint in_relu, float[::1] y):
    cdef mdl_pool2d_shape ps = pool_shape(shape)
    cdef mdl_affine f
    cdef const mdl_affine *fp = affine(&f, in_scale, in_shift, in_relu)
    cdef mdl_status st
    with nogil:
        st = mdl_max_pool2d_forward_fused(&ps, cptr(x), fp, mptr(y))
    check(st)


def max_pool2d_backward_fused(tuple shape, const float[::1] x, const float[::1] in_scale,
                              const float[::1] in_shift, bint in_relu, const float[::1] dy,
                              float[::1] dx):
    cdef mdl_pool2d_shape ps = pool_shape(shape)
    cdef mdl_affine f
    cdef const mdl_affine *fp = affine(&f, in_scale, in_shift, in_relu)
    cdef mdl_status st
    with nogil:
        st = mdl_max_pool2d_backward_fused(&ps, cptr(x), fp, cptr(dy), mptr(dx))
    check(st)


def max_pool2d_forward_argmax(tuple shape, const float[::1] x, const float[::1] in_scale,
                              const float[::1] in_shift, bint in_relu, float[::1] y,
                              uint8_t[::1] tap):
    cdef mdl_pool2d_shape ps = pool_shape(shape)
    cdef mdl_affine f
    cdef const mdl_affine *fp = affine(&f, in_scale, in_shift, in_relu)
    cdef uint8_t *tp = &tap[0] if tap is not None and tap.shape[0] > 0 else NULL
    cdef mdl_status st
    with nogil:
        st = mdl_max_pool2d_forward_argmax(&ps, cptr(x), fp, mptr(y), tp)
    check(st)


def max_pool2d_backward_argmax(tuple shape, const uint8_t[::1] tap, const float[::1] dy,
                               float[::1] dx):
    cdef mdl_pool2d_shape ps = pool_shape(shape)
    cdef const uint8_t *tp = &tap[0] if tap is not None and tap.shape[0] > 0 else NULL
    cdef mdl_status st
    with nogil:
        st = mdl_max_pool2d_backward_argmax(&ps, tp, cptr(dy), mptr(dx))
    check(st)


def avg_pool2d_forward(tuple shape, const float[::1] x, float[::1] y):
    cdef mdl_pool2d_shape ps = pool_shape(shape)
    cdef mdl_status st
    with nogil:
        st = mdl_avg_pool2d_forward(&ps, cptr(x), mptr(y))
    check(st)


def avg_pool2d_backward(tuple shape, const float[::1] dy, float[::1] dx):
    cdef mdl_pool2d_shape ps = pool_shape(shape)
    cdef mdl_status st
    with nogil:
        st = mdl_avg_pool2d_backward(&ps, cptr(dy), mptr(dx))
    check(st)


def global_avg_pool2d_forward(int64_t n, int64_t c, int64_t h, int64_t w, const float[::1] x,
                              float[::1] y):
    cdef mdl_status st
    with nogil:
        st = mdl_global_avg_pool2d_forward(n, c, h, w, cptr(x), mptr(y))
    check(st)


def global_avg_pool2d_backward(int64_t n, int64_t c, int64_t h, int64_t w, const float[::1] dy,
                               float[::1] dx):
    cdef mdl_status st
    with nogil:
        st = mdl_global_avg_pool2d_backward(n, c, h, w, cptr(dy), mptr(dx))
    check(st)


# ---- elementwise --------------------------------------------------------------

def relu_forward(const float[::1] x, float[::1] y):
    cdef mdl_status st
    with nogil:
        st = mdl_relu_forward(x.shape[0], cptr(x), mptr(y))
    check(st)


def relu_backward(const float[::1] x, const float[::1] dy, float[::1] dx):
    cdef mdl_status st
    with nogil:
        st = mdl_relu_backward(x.shape[0], cptr(x), cptr(dy), mptr(dx))
    check(st)


def add(const float[::1] a, const float[::1] b, float[::1] y):
    cdef mdl_status st
    with nogil:
        st = mdl_add(a.shape[0], cptr(a), cptr(b), mptr(y))
    check(st)


def affine_add(int64_t n, int64_t c, int64_t hw, const float[::1] a, const float[::1] a_scale,
               const float[::1] a_shift, bint a_relu, const float[::1] b,
               const float[::1] b_scale, const float[::1] b_shift, bint b_relu, bint relu,
               float[::1] y):
    cdef mdl_affine fa, fb
    cdef const mdl_affine *pa = affine(&fa, a_scale, a_shift, a_relu)
    cdef const mdl_affine *pb = affine(&fb, b_scale, b_shift, b_relu)
    cdef mdl_status st
    with nogil:
        st = mdl_affine_add(n, c, hw, cptr(a), pa, cptr(b), pb, relu, mptr(y))
    check(st)


def dropout_forward(float p, uint64_t seed, const float[::1] x, float[::1] y):
    cdef mdl_status st
    with nogil:
        st = mdl_dropout_forward(x.shape[0], p, seed, cptr(x), mptr(y))
    check(st)


def dropout_backward(float p, uint64_t seed, const float[::1] dy, float[::1] dx):
    cdef mdl_status st
    with nogil:
        st = mdl_dropout_backward(dy.shape[0], p, seed, cptr(dy), mptr(dx))
    check(st)


# ---- batch norm ---------------------------------------------------------------

def batch_norm_forward_train(int64_t n, int64_t c, int64_t hw, const float[::1] x,
                             const float[::1] gamma, const float[::1] beta, float eps,
                             float momentum, float[::1] running_mean, float[::1] running_var,
                             float[::1] y, float[::1] save_mean, float[::1] save_invstd):
    cdef mdl_status st
    with nogil:
        st = mdl_batch_norm_forward_train(n, c, hw, cptr(x), cptr(gamma), cptr(beta), eps, momentum,
                                          mptr(running_mean), mptr(running_var), mptr(y),
                                          mptr(save_mean), mptr(save_invstd))
    check(st)


def batch_norm_forward_infer(int64_t n, int64_t c, int64_t hw, const float[::1] x,
                             const float[::1] gamma, const float[::1] beta,
                             const float[::1] running_mean, const float[::1] running_var,
                             float eps, float[::1] y):
    cdef mdl_status st
    with nogil:
        st = mdl_batch_norm_forward_infer(n, c, hw, cptr(x), cptr(gamma), cptr(beta),
                                          cptr(running_mean), cptr(running_var), eps, mptr(y))
    check(st)


def batch_norm_backward(int64_t n, int64_t c, int64_t hw, const float[::1] x,
                        const float[::1] gamma, const float[::1] dy, const float[::1] save_mean,
                        const float[::1] save_invstd, float[::1] dx, float[::1] dgamma,
                        float[::1] dbeta, bint accumulate=False):
    cdef mdl_status st
    with nogil:
        st = mdl_batch_norm_backward(n, c, hw, cptr(x), cptr(gamma), cptr(dy), cptr(save_mean),
                                     cptr(save_invstd), mptr(dx), mptr(dgamma), mptr(dbeta),
                                     accumulate)
    check(st)


def batch_norm_stats(int64_t c, int64_t count, const double[::1] channel_sum,
                     const double[::1] channel_sumsq, const float[::1] gamma,
                     const float[::1] beta, float eps, float momentum, float[::1] running_mean,
                     float[::1] running_var, float[::1] save_mean, float[::1] save_invstd,
                     float[::1] scale, float[::1] shift):
    cdef mdl_status st
    with nogil:
        st = mdl_batch_norm_stats(c, count, &channel_sum[0], &channel_sumsq[0], cptr(gamma),
                                  cptr(beta), eps, momentum, mptr(running_mean),
                                  mptr(running_var), mptr(save_mean), mptr(save_invstd),
                                  mptr(scale), mptr(shift))
    check(st)


def batch_norm_relu_backward(int64_t n, int64_t c, int64_t hw, const float[::1] x,
                             const float[::1] gamma, const float[::1] dy,
                             const float[::1] save_mean, const float[::1] save_invstd,
                             const float[::1] scale, const float[::1] shift, float[::1] dx,
                             float[::1] dgamma, float[::1] dbeta, bint accumulate=False):
    cdef mdl_status st
    with nogil:
        st = mdl_batch_norm_relu_backward(n, c, hw, cptr(x), cptr(gamma), cptr(dy),
                                          cptr(save_mean), cptr(save_invstd), cptr(scale),
                                          cptr(shift), mptr(dx), mptr(dgamma), mptr(dbeta),
                                          accumulate)
    check(st)


def batch_norm_add_relu_backward(int64_t n, int64_t c, int64_t hw, const float[::1] s,
                                 const float[::1] b, const float[::1] b_scale,
                                 const float[::1] b_shift, bint b_relu, const float[::1] gamma,
                                 const float[::1] beta, const float[::1] dy,
                                 const float[::1] save_invstd, float[::1] dx, float[::1] db,
                                 float[::1] dgamma, float[::1] dbeta, bint accumulate=False):
    cdef mdl_affine fb
    cdef const mdl_affine *pb = affine(&fb, b_scale, b_shift, b_relu)
    cdef mdl_status st
    with nogil:
        st = mdl_batch_norm_add_relu_backward(n, c, hw, cptr(s), cptr(b), pb, cptr(gamma),
                                              cptr(beta), cptr(dy), cptr(save_invstd), mptr(dx),
                                              mptr(db), mptr(dgamma), mptr(dbeta), accumulate)
    check(st)

# ---- linear -------------------------------------------------------------------

def linear_workspace_size(int64_t n, int64_t in_, int64_t out):
    return mdl_linear_workspace_size(n, in_, out)


def linear_forward(int64_t n, int64_t in_, int64_t out, const float[::1] x, const float[::1] w,
                   const float[::1] b, float[::1] y, float[::1] ws=None):
    cdef mdl_status st
    with nogil:
        st = mdl_linear_forward(n, in_, out, cptr(x), cptr(w), cptr(b), mptr(y), wptr(ws), wbytes(ws))
    check(st)


def linear_backward_data(int64_t n, int64_t in_, int64_t out, const float[::1] dy,
                         const float[::1] w, float[::1] dx, float[::1] ws=None):
    cdef mdl_status st
    with nogil:
        st = mdl_linear_backward_data(n, in_, out, cptr(dy), cptr(w), mptr(dx), wptr(ws), wbytes(ws))
    check(st)


def linear_backward_weights(int64_t n, int64_t in_, int64_t out, const float[::1] x,
                            const float[::1] dy, float[::1] dw, float[::1] db,
                            bint accumulate=False, float[::1] ws=None):
    cdef mdl_status st
    with nogil:
        st = mdl_linear_backward_weights(n, in_, out, cptr(x), cptr(dy), mptr(dw), mptr(db),
                                         accumulate, wptr(ws), wbytes(ws))
    check(st)


# ---- loss ---------------------------------------------------------------------

def softmax_cross_entropy(int64_t n, int64_t classes, const float[::1] logits,
                          const int64_t[::1] labels, float[::1] dlogits):
    cdef mdl_status st
    cdef float loss = 0
    with nogil:
        st = mdl_softmax_cross_entropy(n, classes, cptr(logits),
                                       &labels[0] if labels.shape[0] > 0 else NULL,
                                       &loss, mptr(dlogits))
    check(st)
    return loss


# ---- optimizers ---------------------------------------------------------------

def sgd_step(float[::1] param, const float[::1] grad, float[::1] momentum_buf, float lr,
             float momentum, float dampening, float weight_decay, bint nesterov, bint first_step):
    cdef mdl_status st
    with nogil:
        st = mdl_sgd_step(param.shape[0], mptr(param), cptr(grad), mptr(momentum_buf), lr, momentum,
                          dampening, weight_decay, nesterov, first_step)
    check(st)


def adam_step(float[::1] param, const float[::1] grad, float[::1] exp_avg, float[::1] exp_avg_sq,
              int64_t step, float lr, float beta1, float beta2, float eps, float weight_decay,
              bint decoupled):
    cdef mdl_status st
    with nogil:
        st = mdl_adam_step(param.shape[0], mptr(param), cptr(grad), mptr(exp_avg), mptr(exp_avg_sq),
                           step, lr, beta1, beta2, eps, weight_decay, decoupled)
    check(st)
