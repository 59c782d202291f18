# cython: language_level=3
"""Thin bindings to the CUDA kernels (include/minidl_cuda.h): status checked, no logic.

Every kernel function has the name and the parameters, in the same order, of
its twin in minidl._C, but each buffer is a device address given as a Python
int (0 for NULL) instead of a NumPy view, and a last keyword ``stream`` takes
a cudaStream_t as an int (pycuda's ``Stream.handle``; 0 is the default
stream).  Calls are asynchronous on that stream and release the GIL.  What a
device address cannot tell is appended after _C's parameters (before
``stream``):

- ``count`` (elements) for relu_forward, relu_backward, add, dropout_forward,
  dropout_backward, sgd_step and adam_step, which _C reads from the array;
- ``ws_bytes`` after every ``ws`` (the workspace's size in bytes);
- ``loss`` for softmax_cross_entropy: the device address of one float32 that
  receives the mean loss (the function returns None).

The fused kernels take each mdl_affine map as three parameters (scale, shift,
relu): scale 0 with relu False passes a NULL map (the operand as it is).

Errors raise what _C raises: ValueError for a bad argument or a too-small
workspace, MemoryError when out of memory, minidl._C.MinidlError otherwise
(a CUDA error: no device, a failed launch), with the library's message.
Validation of shapes against buffers is the caller's job (minidl/device/).
"""
from libc.stdint cimport int64_t, uint8_t, uint64_t, uintptr_t
from minidl._C cimport (MDL_OK, MDL_ERR_ARG, MDL_ERR_WORKSPACE, MDL_ERR_ALLOC,
                        MDL_ERR_UNSUPPORTED, MDL_ERR_DEVICE, MDL_POOL_MAX, MDL_POOL_AVG,
                        mdl_pool_kind, conv_shape, pool_shape)

from minidl._C import MinidlError

_STATUS = {MDL_ERR_UNSUPPORTED: "unsupported", MDL_ERR_DEVICE: "device error"}


cdef int check(mdl_status st) except -1:
    if st == MDL_OK:
        return 0
    msg = mdl_cuda_last_error().decode("utf-8", "replace")
    if st == MDL_ERR_ARG or st == MDL_ERR_WORKSPACE:
        raise ValueError(msg)
    if st == MDL_ERR_ALLOC:
        raise MemoryError(msg)
    raise MinidlError(f"{_STATUS.get(st, 'unknown status')}: {msg}")


cdef inline const float *cptr(uintptr_t a) noexcept nogil:
    return <const float *>a


cdef inline float *mptr(uintptr_t a) noexcept nogil:
    return <float *>a


cdef inline mdl_cuda_stream sptr(uintptr_t s) noexcept nogil:
    return <mdl_cuda_stream>s


cdef inline const mdl_affine *affine(mdl_affine *m, uintptr_t scale, uintptr_t shift,
                                     bint relu) noexcept nogil:
    """*m set to (scale, shift, relu) and m, or NULL when scale is 0 and relu false."""
    if scale == 0 and not relu:
        return NULL
    m.scale = cptr(scale)
    m.shift = cptr(shift)
    m.relu = relu
    return m


# ---- runtime ------------------------------------------------------------------

def device_count():
    """The number of CUDA devices (0 without a driver or a device)."""
    cdef int n = 0
    check(mdl_cuda_device_count(&n))
    return n


def synchronize(uintptr_t stream=0):
    """Wait for the work queued on `stream`; raises the error of a kernel that failed."""
    cdef mdl_status st
    with nogil:
        st = mdl_cuda_synchronize(sptr(stream))
    check(st)


# ---- gemm ---------------------------------------------------------------------

def sgemm(bint trans_a, bint trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          uintptr_t a, int64_t lda, uintptr_t b, int64_t ldb, float beta, uintptr_t c,
          int64_t ldc, uintptr_t ws=0, size_t ws_bytes=0, uintptr_t stream=0):
    cdef mdl_status st
    with nogil:
        st = mdl_cuda_sgemm(trans_a, trans_b, m, n, k, alpha, cptr(a), lda, cptr(b), ldb, beta,
                            mptr(c), ldc, <void *>ws, ws_bytes, sptr(stream))
    check(st)


def sgemm_workspace_size(int64_t m, int64_t n, int64_t k):
    return mdl_cuda_sgemm_workspace_size(m, n, k)


# ---- conv ---------------------------------------------------------------------

def conv2d_output_size(tuple shape):
    cdef mdl_conv2d_shape cs = conv_shape(shape)
    cdef int64_t ho = 0, wo = 0
    check(mdl_cuda_conv2d_output_size(&cs, &ho, &wo))
    return ho, wo


def conv2d_workspace_size(tuple shape):
    cdef mdl_conv2d_shape cs = conv_shape(shape)
    return mdl_cuda_conv2d_workspace_size(&cs)


def conv2d_forward(tuple shape, uintptr_t x, uintptr_t w, uintptr_t bias, uintptr_t y,
                   uintptr_t ws=0, size_t ws_bytes=0, uintptr_t stream=0):
    cdef mdl_conv2d_shape cs = conv_shape(shape)
    cdef mdl_status st
    with nogil:
        st = mdl_cuda_conv2d_forward(&cs, cptr(x), cptr(w), cptr(bias), mptr(y), <void *>ws,
                                     ws_bytes, sptr(stream))
    check(st)


def conv2d_forward_ex(tuple shape, uintptr_t x, uintptr_t w, uintptr_t bias, bint relu,
                      uintptr_t channel_sum, uintptr_t channel_sumsq, uintptr_t y, uintptr_t ws=0,
                      size_t ws_bytes=0, uintptr_t stream=0):
    cdef mdl_conv2d_shape cs = conv_shape(shape)
    cdef mdl_status st
    with nogil:
        st = mdl_cuda_conv2d_forward_ex(&cs, cptr(x), cptr(w), cptr(bias), relu,
                                        <double *>channel_sum, <double *>channel_sumsq, mptr(y),
                                        <void *>ws, ws_bytes, sptr(stream))
    check(st)


def conv2d_pooled_workspace_size(tuple shape, tuple pool):
    cdef mdl_conv2d_shape cs = conv_shape(shape)
    cdef mdl_pool2d_shape ps = pool_shape(pool)
    return mdl_cuda_conv2d_pooled_workspace_size(&cs, &ps)


def conv2d_forward_pooled(tuple shape, uintptr_t x, uintptr_t w, uintptr_t bias, bint relu,
                          tuple pool, bint pool_avg, bint pool_relu, uintptr_t y, uintptr_t ws=0,
                          size_t ws_bytes=0, uintptr_t stream=0):
    cdef mdl_conv2d_shape cs = conv_shape(shape)
    cdef mdl_pool2d_shape ps = pool_shape(pool)
    cdef mdl_pool_kind kind = MDL_POOL_AVG if pool_avg else MDL_POOL_MAX
    cdef mdl_status st
    with nogil:
        st = mdl_cuda_conv2d_forward_pooled(&cs, cptr(x), cptr(w), cptr(bias), relu, &ps, kind,
                                            pool_relu, mptr(y), <void *>ws, ws_bytes,
                                            sptr(stream))
    check(st)


def conv2d_forward_fused(tuple shape, uintptr_t x, uintptr_t in_scale, uintptr_t in_shift,
                         bint in_relu, uintptr_t w, uintptr_t bias, bint relu,
                         uintptr_t channel_sum, uintptr_t channel_sumsq, uintptr_t y,
                         uintptr_t ws=0, size_t ws_bytes=0, uintptr_t stream=0):
    cdef mdl_conv2d_shape cs = conv_shape(shape)
    cdef mdl_affine m
    cdef const mdl_affine *fin = affine(&m, in_scale, in_shift, in_relu)
    cdef mdl_status st
    with nogil:
        st = mdl_cuda_conv2d_forward_fused(&cs, cptr(x), fin, cptr(w), cptr(bias), relu,
                                           <double *>channel_sum, <double *>channel_sumsq,
                                           mptr(y), <void *>ws, ws_bytes, sptr(stream))
    check(st)


def conv2d_backward_data(tuple shape, uintptr_t dy, uintptr_t w, uintptr_t dx, uintptr_t ws=0,
                         size_t ws_bytes=0, uintptr_t stream=0):
    cdef mdl_conv2d_shape cs = conv_shape(shape)
    cdef mdl_status st
    with nogil:
        st = mdl_cuda_conv2d_backward_data(&cs, cptr(dy), cptr(w), mptr(dx), <void *>ws, ws_bytes,
                                           sptr(stream))
    check(st)


def conv2d_backward_data_fused(tuple shape, uintptr_t dy, uintptr_t w, uintptr_t dx,
                               bint accumulate, uintptr_t ws=0, size_t ws_bytes=0,
                               uintptr_t stream=0):
    cdef mdl_conv2d_shape cs = conv_shape(shape)
    cdef mdl_status st
    with nogil:
        st = mdl_cuda_conv2d_backward_data_fused(&cs, cptr(dy), cptr(w), mptr(dx), accumulate,
                                                 <void *>ws, ws_bytes, sptr(stream))
    check(st)


def conv2d_backward_weights(tuple shape, uintptr_t x, uintptr_t dy, uintptr_t dw,
                            bint accumulate=False, uintptr_t ws=0, size_t ws_bytes=0,
                            uintptr_t stream=0):
    cdef mdl_conv2d_shape cs = conv_shape(shape)
    cdef mdl_status st
    with nogil:
        st = mdl_cuda_conv2d_backward_weights(&cs, cptr(x), cptr(dy), mptr(dw), accumulate,
                                              <void *>ws, ws_bytes, sptr(stream))
    check(st)


def conv2d_backward_weights_fused(tuple shape, uintptr_t x, uintptr_t in_scale,
                                  uintptr_t in_shift, bint in_relu, uintptr_t dy, uintptr_t dw,
                                  bint accumulate, uintptr_t ws=0, size_t ws_bytes=0,
                                  uintptr_t stream=0):
    cdef mdl_conv2d_shape cs = conv_shape(shape)
    cdef mdl_affine m
    cdef const mdl_affine *fin = affine(&m, in_scale, in_shift, in_relu)
    cdef mdl_status st
    with nogil:
        st = mdl_cuda_conv2d_backward_weights_fused(&cs, cptr(x), fin, cptr(dy), mptr(dw),
                                                    accumulate, <void *>ws, ws_bytes,
                                                    sptr(stream))
    check(st)


def conv2d_backward(tuple shape, uintptr_t x, uintptr_t in_scale, uintptr_t in_shift,
                    bint in_relu, uintptr_t dy, uintptr_t w, uintptr_t dx, bint accumulate_dx,
                    uintptr_t dw, bint accumulate_dw=False, uintptr_t ws=0, size_t ws_bytes=0,
                    uintptr_t stream=0):
    cdef mdl_conv2d_shape cs = conv_shape(shape)
    cdef mdl_affine m
    cdef const mdl_affine *fin = affine(&m, in_scale, in_shift, in_relu)
    cdef mdl_status st
    with nogil:
        st = mdl_cuda_conv2d_backward(&cs, cptr(x), fin, cptr(dy), cptr(w), mptr(dx),
                                      accumulate_dx, mptr(dw), accumulate_dw, <void *>ws,
                                      ws_bytes, sptr(stream))
    check(st)


def conv2d_backward_bias(tuple shape, uintptr_t dy, uintptr_t db, bint accumulate=False,
                         uintptr_t stream=0):
    cdef mdl_conv2d_shape cs = conv_shape(shape)
    cdef mdl_status st
    with nogil:
        st = mdl_cuda_conv2d_backward_bias(&cs, cptr(dy), mptr(db), accumulate, sptr(stream))
    check(st)


# ---- pooling ------------------------------------------------------------------

def pool2d_output_size(tuple shape):
    cdef mdl_pool2d_shape ps = pool_shape(shape)
    cdef int64_t ho = 0, wo = 0
    check(mdl_cuda_pool2d_output_size(&ps, &ho, &wo))
    return ho, wo


def max_pool2d_forward(tuple shape, uintptr_t x, uintptr_t y, uintptr_t stream=0):
    cdef mdl_pool2d_shape ps = pool_shape(shape)
    cdef mdl_status st
    with nogil:
        st = mdl_cuda_max_pool2d_forward(&ps, cptr(x), mptr(y), sptr(stream))
    check(st)


def max_pool2d_backward(tuple shape, uintptr_t x, uintptr_t dy, uintptr_t dx, uintptr_t stream=0):
    cdef mdl_pool2d_shape ps = pool_shape(shape)
    cdef mdl_status st
    with nogil:
        st = mdl_cuda_max_pool2d_backward(&ps, cptr(x), cptr(dy), mptr(dx), sptr(stream))
    check(st)


def max_pool2d_forward_fused(tuple shape, uintptr_t x, uintptr_t in_scale, uintptr_t in_shift,
                             bint in_relu, uintptr_t y, uintptr_t stream=0):
    cdef mdl_pool2d_shape ps = pool_shape(shape)
    cdef mdl_affine m
    cdef const mdl_affine *fin = affine(&m, in_scale, in_shift, in_relu)
    cdef mdl_status st
    with nogil:
        st = mdl_cuda_max_pool2d_forward_fused(&ps, cptr(x), fin, mptr(y), sptr(stream))
    check(st)


def max_pool2d_backward_fused(tuple shape, uintptr_t x, uintptr_t in_scale, uintptr_t in_shift,
                              bint in_relu, uintptr_t dy, uintptr_t dx, uintptr_t stream=0):
    cdef mdl_pool2d_shape ps = pool_shape(shape)
    cdef mdl_affine m
    cdef const mdl_affine *fin = affine(&m, in_scale, in_shift, in_relu)
    cdef mdl_status st
    with nogil:
        st = mdl_cuda_max_pool2d_backward_fused(&ps, cptr(x), fin, cptr(dy), mptr(dx),
                                                sptr(stream))
    check(st)


def max_pool2d_forward_argmax(tuple shape, uintptr_t x, uintptr_t in_scale, uintptr_t in_shift,
                              bint in_relu, uintptr_t y, uintptr_t tap, bint relu=False,
                              uintptr_t stream=0):
    cdef mdl_pool2d_shape ps = pool_shape(shape)
    cdef mdl_affine m
    cdef const mdl_affine *fin = affine(&m, in_scale, in_shift, in_relu)
    cdef mdl_status st
    with nogil:
        if relu:
            st = mdl_cuda_max_pool2d_forward_argmax_relu(&ps, cptr(x), fin, mptr(y),
                                                         <uint8_t *>tap, sptr(stream))
        else:
            st = mdl_cuda_max_pool2d_forward_argmax(&ps, cptr(x), fin, mptr(y), <uint8_t *>tap,
                                                    sptr(stream))
    check(st)


def max_pool2d_backward_argmax(tuple shape, uintptr_t tap, uintptr_t dy, uintptr_t dx,
                               uintptr_t stream=0):
    cdef mdl_pool2d_shape ps = pool_shape(shape)
    cdef mdl_status st
    with nogil:
        st = mdl_cuda_max_pool2d_backward_argmax(&ps, <const uint8_t *>tap, cptr(dy), mptr(dx),
                                                 sptr(stream))
    check(st)


def avg_pool2d_forward(tuple shape, uintptr_t x, uintptr_t y, uintptr_t stream=0):
    cdef mdl_pool2d_shape ps = pool_shape(shape)
    cdef mdl_status st
    with nogil:
        st = mdl_cuda_avg_pool2d_forward(&ps, cptr(x), mptr(y), sptr(stream))
    check(st)


def avg_pool2d_backward(tuple shape, uintptr_t dy, uintptr_t dx, uintptr_t relu_x=0,
                        uintptr_t stream=0):
    cdef mdl_pool2d_shape ps = pool_shape(shape)
    cdef mdl_status st
    with nogil:
        if relu_x:
            st = mdl_cuda_avg_pool2d_backward_relu(&ps, cptr(relu_x), cptr(dy), mptr(dx),
                                                   sptr(stream))
        else:
            st = mdl_cuda_avg_pool2d_backward(&ps, cptr(dy), mptr(dx), sptr(stream))
    check(st)


def global_avg_pool2d_forward(int64_t n, int64_t c, int64_t h, int64_t w, uintptr_t x,
                              uintptr_t y, uintptr_t stream=0):
    cdef mdl_status st
    with nogil:
        st = mdl_cuda_global_avg_pool2d_forward(n, c, h, w, cptr(x), mptr(y), sptr(stream))
    check(st)


def global_avg_pool2d_backward(int64_t n, int64_t c, int64_t h, int64_t w, uintptr_t dy,
                               uintptr_t dx, uintptr_t stream=0):
    cdef mdl_status st
    with nogil:
        st = mdl_cuda_global_avg_pool2d_backward(n, c, h, w, cptr(dy), mptr(dx), sptr(stream))
    check(st)


# ---- elementwise --------------------------------------------------------------

def relu_forward(uintptr_t x, uintptr_t y, int64_t count, uintptr_t stream=0):
    cdef mdl_status st
    with nogil:
        st = mdl_cuda_relu_forward(count, cptr(x), mptr(y), sptr(stream))
    check(st)


def relu_backward(uintptr_t x, uintptr_t dy, uintptr_t dx, int64_t count, uintptr_t stream=0):
    cdef mdl_status st
    with nogil:
        st = mdl_cuda_relu_backward(count, cptr(x), cptr(dy), mptr(dx), sptr(stream))
    check(st)


def add(uintptr_t a, uintptr_t b, uintptr_t y, int64_t count, uintptr_t stream=0):
    cdef mdl_status st
    with nogil:
        st = mdl_cuda_add(count, cptr(a), cptr(b), mptr(y), sptr(stream))
    check(st)


def affine_add(int64_t n, int64_t c, int64_t hw, uintptr_t a, uintptr_t a_scale,
               uintptr_t a_shift, bint a_relu, uintptr_t b, uintptr_t b_scale, uintptr_t b_shift,
               bint b_relu, bint relu, uintptr_t y, uintptr_t stream=0):
    cdef mdl_affine ma, mb
    cdef const mdl_affine *fa = affine(&ma, a_scale, a_shift, a_relu)
    cdef const mdl_affine *fb = affine(&mb, b_scale, b_shift, b_relu)
    cdef mdl_status st
    with nogil:
        st = mdl_cuda_affine_add(n, c, hw, cptr(a), fa, cptr(b), fb, relu, mptr(y),
                                 sptr(stream))
    check(st)


def dropout_forward(float p, uint64_t seed, uintptr_t x, uintptr_t y, int64_t count,
                    uintptr_t stream=0):
    cdef mdl_status st
    with nogil:
        st = mdl_cuda_dropout_forward(count, p, seed, cptr(x), mptr(y), sptr(stream))
    check(st)


def dropout_backward(float p, uint64_t seed, uintptr_t dy, uintptr_t dx, int64_t count,
                     uintptr_t stream=0):
    cdef mdl_status st
    with nogil:
        st = mdl_cuda_dropout_backward(count, p, seed, cptr(dy), mptr(dx), sptr(stream))
    check(st)


# ---- batch norm ---------------------------------------------------------------

def batch_norm_forward_train(int64_t n, int64_t c, int64_t hw, uintptr_t x, uintptr_t gamma,
                             uintptr_t beta, float eps, float momentum, uintptr_t running_mean,
                             uintptr_t running_var, uintptr_t y, uintptr_t save_mean,
                             uintptr_t save_invstd, uintptr_t stream=0):
    cdef mdl_status st
    with nogil:
        st = mdl_cuda_batch_norm_forward_train(n, c, hw, cptr(x), cptr(gamma), cptr(beta), eps,
                                               momentum, mptr(running_mean), mptr(running_var),
                                               mptr(y), mptr(save_mean), mptr(save_invstd),
                                               sptr(stream))
    check(st)


def batch_norm_forward_infer(int64_t n, int64_t c, int64_t hw, uintptr_t x, uintptr_t gamma,
                             uintptr_t beta, uintptr_t running_mean, uintptr_t running_var,
                             float eps, uintptr_t y, uintptr_t stream=0):
    cdef mdl_status st
    with nogil:
        st = mdl_cuda_batch_norm_forward_infer(n, c, hw, cptr(x), cptr(gamma), cptr(beta),
                                               cptr(running_mean), cptr(running_var), eps,
                                               mptr(y), sptr(stream))
    check(st)


def batch_norm_backward(int64_t n, int64_t c, int64_t hw, uintptr_t x, uintptr_t gamma,
                        uintptr_t dy, uintptr_t save_mean, uintptr_t save_invstd, uintptr_t dx,
                        uintptr_t dgamma, uintptr_t dbeta, bint accumulate=False,
                        uintptr_t stream=0):
    cdef mdl_status st
    with nogil:
        st = mdl_cuda_batch_norm_backward(n, c, hw, cptr(x), cptr(gamma), cptr(dy),
                                          cptr(save_mean), cptr(save_invstd), mptr(dx),
                                          mptr(dgamma), mptr(dbeta), accumulate, sptr(stream))
    check(st)


def batch_norm_stats(int64_t c, int64_t count, uintptr_t channel_sum, uintptr_t channel_sumsq,
                     uintptr_t gamma, uintptr_t beta, float eps, float momentum,
                     uintptr_t running_mean, uintptr_t running_var, uintptr_t save_mean,
                     uintptr_t save_invstd, uintptr_t scale, uintptr_t shift, uintptr_t stream=0):
    cdef mdl_status st
    with nogil:
        st = mdl_cuda_batch_norm_stats(c, count, <const double *>channel_sum,
                                       <const double *>channel_sumsq, cptr(gamma), cptr(beta),
                                       eps, momentum, mptr(running_mean), mptr(running_var),
                                       mptr(save_mean), mptr(save_invstd), mptr(scale),
                                       mptr(shift), sptr(stream))
    check(st)


def batch_norm_relu_backward(int64_t n, int64_t c, int64_t hw, uintptr_t x, uintptr_t gamma,
                             uintptr_t dy, uintptr_t save_mean, uintptr_t save_invstd,
                             uintptr_t scale, uintptr_t shift, uintptr_t dx, uintptr_t dgamma,
                             uintptr_t dbeta, bint accumulate=False, uintptr_t stream=0):
    cdef mdl_status st
    with nogil:
        st = mdl_cuda_batch_norm_relu_backward(n, c, hw, cptr(x), cptr(gamma), cptr(dy),
                                               cptr(save_mean), cptr(save_invstd), cptr(scale),
                                               cptr(shift), mptr(dx), mptr(dgamma), mptr(dbeta),
                                               accumulate, sptr(stream))
    check(st)


def batch_norm_add_relu_backward(int64_t n, int64_t c, int64_t hw, uintptr_t s, uintptr_t b,
                                 uintptr_t b_scale, uintptr_t b_shift, bint b_relu,
                                 uintptr_t gamma, uintptr_t beta, uintptr_t dy,
                                 uintptr_t save_invstd, uintptr_t dx, uintptr_t db,
                                 uintptr_t dgamma, uintptr_t dbeta, bint accumulate=False,
                                 uintptr_t stream=0):
    cdef mdl_affine fb
    cdef const mdl_affine *pb = affine(&fb, b_scale, b_shift, b_relu)
    cdef mdl_status st
    with nogil:
        st = mdl_cuda_batch_norm_add_relu_backward(n, c, hw, cptr(s), cptr(b), pb, cptr(gamma),
                                                   cptr(beta), cptr(dy), cptr(save_invstd),
                                                   mptr(dx), mptr(db), mptr(dgamma),
                                                   mptr(dbeta), accumulate, sptr(stream))
    check(st)


# ---- linear -------------------------------------------------------------------

def linear_workspace_size(int64_t n, int64_t in_, int64_t out):
    return mdl_cuda_linear_workspace_size(n, in_, out)


def linear_forward(int64_t n, int64_t in_, int64_t out, uintptr_t x, uintptr_t w, uintptr_t b,
                   uintptr_t y, uintptr_t ws=0, size_t ws_bytes=0, uintptr_t stream=0):
    cdef mdl_status st
    with nogil:
        st = mdl_cuda_linear_forward(n, in_, out, cptr(x), cptr(w), cptr(b), mptr(y), <void *>ws,
                                     ws_bytes, sptr(stream))
    check(st)


def linear_backward_data(int64_t n, int64_t in_, int64_t out, uintptr_t dy, uintptr_t w,
                         uintptr_t dx, uintptr_t ws=0, size_t ws_bytes=0, uintptr_t stream=0):
    cdef mdl_status st
    with nogil:
        st = mdl_cuda_linear_backward_data(n, in_, out, cptr(dy), cptr(w), mptr(dx), <void *>ws,
                                           ws_bytes, sptr(stream))
    check(st)


def linear_backward_weights(int64_t n, int64_t in_, int64_t out, uintptr_t x, uintptr_t dy,
                            uintptr_t dw, uintptr_t db, bint accumulate=False, uintptr_t ws=0,
                            size_t ws_bytes=0, uintptr_t stream=0):
    cdef mdl_status st
    with nogil:
        st = mdl_cuda_linear_backward_weights(n, in_, out, cptr(x), cptr(dy), mptr(dw), mptr(db),
                                              accumulate, <void *>ws, ws_bytes, sptr(stream))
    check(st)


# ---- loss ---------------------------------------------------------------------

def softmax_cross_entropy(int64_t n, int64_t classes, uintptr_t logits, uintptr_t labels,
                          uintptr_t dlogits, uintptr_t loss, uintptr_t stream=0):
    """labels: n int64 class indices (device; not range-checked: an index outside
    [0, classes) gives a NaN loss); loss: one float32 (device) that receives the mean."""
    cdef mdl_status st
    with nogil:
        st = mdl_cuda_softmax_cross_entropy(n, classes, cptr(logits), <const int64_t *>labels,
                                            mptr(loss), mptr(dlogits), sptr(stream))
    check(st)


# ---- optimizers ---------------------------------------------------------------

def sgd_step(uintptr_t param, uintptr_t grad, uintptr_t momentum_buf, float lr, float momentum,
             float dampening, float weight_decay, bint nesterov, bint first_step, int64_t count,
             uintptr_t stream=0):
    cdef mdl_status st
    with nogil:
        st = mdl_cuda_sgd_step(count, mptr(param), cptr(grad), mptr(momentum_buf), lr, momentum,
                               dampening, weight_decay, nesterov, first_step, sptr(stream))
    check(st)


def adam_step(uintptr_t param, uintptr_t grad, uintptr_t exp_avg, uintptr_t exp_avg_sq,
              int64_t step, float lr, float beta1, float beta2, float eps, float weight_decay,
              bint decoupled, int64_t count, uintptr_t stream=0):
    cdef mdl_status st
    with nogil:
        st = mdl_cuda_adam_step(count, mptr(param), cptr(grad), mptr(exp_avg), mptr(exp_avg_sq),
                                step, lr, beta1, beta2, eps, weight_decay, decoupled,
                                sptr(stream))
    check(st)
