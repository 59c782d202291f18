# cython: language_level=3
"""Thin bindings to the C core: flat float32 buffers in, status checked, no logic.

Validation, shapes and output allocation live in minidl/ops.py.  Every kernel
call releases the GIL.  Arrays are 1-D C-contiguous NumPy arrays of the kernel's
type (``a.reshape(-1)``; float32 unless the C API says otherwise), read through
NumPy's C API and checked here (TypeError, ValueError); None stands for a NULL
pointer where the C API allows one.
"""
from libc.stdint cimport int64_t, uint64_t, uint8_t
cimport numpy as cnp

cnp.import_array()


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


cdef void *data(object a, int typenum, bint writable) except? NULL:
    """The data of a 1-D C-contiguous NumPy array of the given type: NULL for None or
    an empty array.  Read from the array itself, which costs about a tenth of a typed
    memoryview's acquisition (0.15 us per argument)."""
    if a is None:
        return NULL
    if not cnp.PyArray_Check(a):
        raise TypeError(f"expected a NumPy array, got {type(a).__name__}")
    cdef cnp.ndarray arr = <cnp.ndarray>a
    if cnp.PyArray_TYPE(arr) != typenum:
        raise ValueError(f"expected {cnp.PyArray_DescrFromType(typenum)} data, got {arr.dtype}")
    if cnp.PyArray_NDIM(arr) != 1 or not cnp.PyArray_IS_C_CONTIGUOUS(arr):
        raise ValueError(f"expected a 1-D C-contiguous array, got shape {a.shape}")
    if writable and not cnp.PyArray_ISWRITEABLE(arr):
        raise ValueError("the output array is read-only")
    return cnp.PyArray_DATA(arr) if cnp.PyArray_SIZE(arr) > 0 else NULL


cdef inline const float *cptr(object a) except? NULL:
    return <const float *>data(a, cnp.NPY_FLOAT32, False)


cdef inline float *mptr(object a) except? NULL:
    return <float *>data(a, cnp.NPY_FLOAT32, True)


cdef inline size_t nbytes(object a) except? 0:
    """The size of a float32 workspace in bytes (0 for None)."""
    return 0 if a is None else <size_t>cnp.PyArray_NBYTES(a)


cdef inline int64_t size(object a) except? -1:
    return 0 if a is None else cnp.PyArray_SIZE(a)


cdef inline const mdl_affine *affine(mdl_affine *f, scale, shift, bint relu) except? NULL:
    """f filled in, or NULL for the identity (no scale, no ReLU)."""
    f.scale, f.shift, f.relu = cptr(scale), cptr(shift), relu
    return f if f.scale != NULL or relu else NULL


# ---- runtime -------------------------------------------------------------------

def version():
    return mdl_version().decode()


def set_keep_workspace(bint keep):
    """Whether the kernels keep their scratch memory for the next call (True, the
    default) or free it when they return (False, which also frees what is kept now)."""
    mdl_set_keep_workspace(keep)


def get_keep_workspace():
    return bool(mdl_get_keep_workspace())


def set_num_threads(int n):
    check(mdl_set_num_threads(n))


def get_num_threads():
    return mdl_get_num_threads()


def set_min_parallel_work(int64_t work):
    check(mdl_set_min_parallel_work(work))


SGEMM_B = {"auto": MDL_SGEMM_B_AUTO, "in-place": MDL_SGEMM_B_IN_PLACE,
           "packed": MDL_SGEMM_B_PACKED}


def set_sgemm_b(str mode):
    """Whether the AVX-512 SGEMM reads op(B) in place for C of 29-256 rows ("in-place"),
    packs it ("packed") or chooses by CPU ("auto", the default: packed on Intel's)."""
    if mode not in SGEMM_B:
        raise ValueError(f"sgemm b mode must be one of {sorted(SGEMM_B)}, got {mode!r}")
    check(mdl_set_sgemm_b(SGEMM_B[mode]))


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

def sgemm(bint trans_a, bint trans_b, int64_t m, int64_t n, int64_t k, float alpha, a, int64_t lda,
          b, int64_t ldb, float beta, c, int64_t ldc, ws=None):
    cdef mdl_status st
    cdef const float *c_a = cptr(a)
    cdef const float *c_b = cptr(b)
    cdef float *m_c = mptr(c)
    cdef void *w_ws = mptr(ws)
    cdef size_t nb_ws = nbytes(ws)
    with nogil:
        st = mdl_sgemm(trans_a, trans_b, m, n, k, alpha, c_a, lda, c_b, ldb, beta, m_c, ldc, w_ws,
                       nb_ws)
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


WINOGRAD_SUMS = {"auto": MDL_WINOGRAD_SUMS_AUTO, "registers": MDL_WINOGRAD_SUMS_REGISTERS,
                 "sgemm": MDL_WINOGRAD_SUMS_SGEMM}


def set_winograd_sums(str mode):
    """Whether the channel Winograd sums in registers ("registers"), by one SGEMM per
    transform point ("sgemm") or chooses by shape and CPU ("auto", the default)."""
    if mode not in WINOGRAD_SUMS:
        raise ValueError(f"winograd sums mode must be one of {sorted(WINOGRAD_SUMS)}, got {mode!r}")
    check(mdl_set_winograd_sums(WINOGRAD_SUMS[mode]))


def conv2d_workspace_size(tuple shape):
    cdef mdl_conv2d_shape cs = conv_shape(shape)
    return mdl_conv2d_workspace_size(&cs)


def conv2d_forward(tuple shape, x, w, bias, y, ws=None):
    cdef mdl_conv2d_shape cs = conv_shape(shape)
    cdef mdl_status st
    cdef const float *c_x = cptr(x)
    cdef const float *c_w = cptr(w)
    cdef const float *c_bias = cptr(bias)
    cdef float *m_y = mptr(y)
    cdef void *w_ws = mptr(ws)
    cdef size_t nb_ws = nbytes(ws)
    with nogil:
        st = mdl_conv2d_forward(&cs, c_x, c_w, c_bias, m_y, w_ws, nb_ws)
    check(st)


def conv2d_forward_ex(tuple shape, x, w, bias, bint relu, channel_sum, channel_sumsq, y, ws=None):
    cdef mdl_conv2d_shape cs = conv_shape(shape)
    cdef mdl_status st
    cdef double *sums = <double *>data(channel_sum, cnp.NPY_FLOAT64, True)
    cdef double *sumsq = <double *>data(channel_sumsq, cnp.NPY_FLOAT64, True)
    cdef const float *c_x = cptr(x)
    cdef const float *c_w = cptr(w)
    cdef const float *c_bias = cptr(bias)
    cdef float *m_y = mptr(y)
    cdef void *w_ws = mptr(ws)
    cdef size_t nb_ws = nbytes(ws)
    with nogil:
        st = mdl_conv2d_forward_ex(&cs, c_x, c_w, c_bias, relu, sums, sumsq, m_y, w_ws, nb_ws)
    check(st)


def conv2d_forward_fused(tuple shape, x, in_scale, in_shift, bint in_relu, w, bias, bint relu,
                         channel_sum, channel_sumsq, y, ws=None):
    cdef mdl_conv2d_shape cs = conv_shape(shape)
    cdef mdl_affine f
    cdef const mdl_affine *fp = affine(&f, in_scale, in_shift, in_relu)
    cdef mdl_status st
    cdef double *sums = <double *>data(channel_sum, cnp.NPY_FLOAT64, True)
    cdef double *sumsq = <double *>data(channel_sumsq, cnp.NPY_FLOAT64, True)
    cdef const float *c_x = cptr(x)
    cdef const float *c_w = cptr(w)
    cdef const float *c_bias = cptr(bias)
    cdef float *m_y = mptr(y)
    cdef void *w_ws = mptr(ws)
    cdef size_t nb_ws = nbytes(ws)
    with nogil:
        st = mdl_conv2d_forward_fused(&cs, c_x, fp, c_w, c_bias, relu, sums, sumsq, m_y, w_ws,
                                      nb_ws)
    check(st)


def conv2d_pooled_workspace_size(tuple shape, tuple pool):
    cdef mdl_conv2d_shape cs = conv_shape(shape)
    cdef mdl_pool2d_shape ps = pool_shape(pool)
    return mdl_conv2d_pooled_workspace_size(&cs, &ps)


def conv2d_forward_pooled(tuple shape, x, w, bias, bint relu, tuple pool, bint pool_avg,
                          bint pool_relu, y, ws=None):
    cdef mdl_conv2d_shape cs = conv_shape(shape)
    cdef mdl_pool2d_shape ps = pool_shape(pool)
    cdef mdl_pool_kind kind = MDL_POOL_AVG if pool_avg else MDL_POOL_MAX
    cdef mdl_status st
    cdef const float *c_x = cptr(x)
    cdef const float *c_w = cptr(w)
    cdef const float *c_bias = cptr(bias)
    cdef float *m_y = mptr(y)
    cdef void *w_ws = mptr(ws)
    cdef size_t nb_ws = nbytes(ws)
    with nogil:
        st = mdl_conv2d_forward_pooled(&cs, c_x, c_w, c_bias, relu, &ps, kind, pool_relu, m_y,
                                       w_ws, nb_ws)
    check(st)


def conv2d_backward_data(tuple shape, dy, w, dx, ws=None):
    cdef mdl_conv2d_shape cs = conv_shape(shape)
    cdef mdl_status st
    cdef const float *c_dy = cptr(dy)
    cdef const float *c_w = cptr(w)
    cdef float *m_dx = mptr(dx)
    cdef void *w_ws = mptr(ws)
    cdef size_t nb_ws = nbytes(ws)
    with nogil:
        st = mdl_conv2d_backward_data(&cs, c_dy, c_w, m_dx, w_ws, nb_ws)
    check(st)


def conv2d_backward_data_fused(tuple shape, dy, w, dx, bint accumulate, ws=None):
    cdef mdl_conv2d_shape cs = conv_shape(shape)
    cdef mdl_status st
    cdef const float *c_dy = cptr(dy)
    cdef const float *c_w = cptr(w)
    cdef float *m_dx = mptr(dx)
    cdef void *w_ws = mptr(ws)
    cdef size_t nb_ws = nbytes(ws)
    with nogil:
        st = mdl_conv2d_backward_data_fused(&cs, c_dy, c_w, m_dx, accumulate, w_ws, nb_ws)
    check(st)


def conv2d_backward_weights(tuple shape, x, dy, dw, bint accumulate=False, ws=None):
    cdef mdl_conv2d_shape cs = conv_shape(shape)
    cdef mdl_status st
    cdef const float *c_x = cptr(x)
    cdef const float *c_dy = cptr(dy)
    cdef float *m_dw = mptr(dw)
    cdef void *w_ws = mptr(ws)
    cdef size_t nb_ws = nbytes(ws)
    with nogil:
        st = mdl_conv2d_backward_weights(&cs, c_x, c_dy, m_dw, accumulate, w_ws, nb_ws)
    check(st)


def conv2d_backward_weights_fused(tuple shape, x, in_scale, in_shift, bint in_relu, dy, dw,
                                  bint accumulate, ws=None):
    cdef mdl_conv2d_shape cs = conv_shape(shape)
    cdef mdl_affine f
    cdef const mdl_affine *fp = affine(&f, in_scale, in_shift, in_relu)
    cdef mdl_status st
    cdef const float *c_x = cptr(x)
    cdef const float *c_dy = cptr(dy)
    cdef float *m_dw = mptr(dw)
    cdef void *w_ws = mptr(ws)
    cdef size_t nb_ws = nbytes(ws)
    with nogil:
        st = mdl_conv2d_backward_weights_fused(&cs, c_x, fp, c_dy, m_dw, accumulate, w_ws, nb_ws)
    check(st)


def conv2d_backward(tuple shape, x, in_scale, in_shift, bint in_relu, dy, w, dx,
                    bint accumulate_dx, dw, bint accumulate_dw=False, ws=None):
    cdef mdl_conv2d_shape cs = conv_shape(shape)
    cdef mdl_affine f
    cdef const mdl_affine *fp = affine(&f, in_scale, in_shift, in_relu)
    cdef mdl_status st
    cdef const float *c_x = cptr(x)
    cdef const float *c_dy = cptr(dy)
    cdef const float *c_w = cptr(w)
    cdef float *m_dx = mptr(dx)
    cdef float *m_dw = mptr(dw)
    cdef void *w_ws = mptr(ws)
    cdef size_t nb_ws = nbytes(ws)
    with nogil:
        st = mdl_conv2d_backward(&cs, c_x, fp, c_dy, c_w, m_dx, accumulate_dx, m_dw,
                                 accumulate_dw, w_ws, nb_ws)
    check(st)


def conv2d_backward_bias(tuple shape, dy, db, bint accumulate=False):
    cdef mdl_conv2d_shape cs = conv_shape(shape)
    cdef mdl_status st
    cdef const float *c_dy = cptr(dy)
    cdef float *m_db = mptr(db)
    with nogil:
        st = mdl_conv2d_backward_bias(&cs, c_dy, m_db, accumulate)
    check(st)


# ---- pooling ------------------------------------------------------------------

def pool2d_output_size(tuple shape):
    cdef mdl_pool2d_shape ps = pool_shape(shape)
    cdef int64_t ho = 0, wo = 0
    check(mdl_pool2d_output_size(&ps, &ho, &wo))
    return ho, wo


def max_pool2d_forward(tuple shape, x, y):
    cdef mdl_pool2d_shape ps = pool_shape(shape)
    cdef mdl_status st
    cdef const float *c_x = cptr(x)
    cdef float *m_y = mptr(y)
    with nogil:
        st = mdl_max_pool2d_forward(&ps, c_x, m_y)
    check(st)


def max_pool2d_backward(tuple shape, x, dy, dx):
    cdef mdl_pool2d_shape ps = pool_shape(shape)
    cdef mdl_status st
    cdef const float *c_x = cptr(x)
    cdef const float *c_dy = cptr(dy)
    cdef float *m_dx = mptr(dx)
    with nogil:
        st = mdl_max_pool2d_backward(&ps, c_x, c_dy, m_dx)
    check(st)


def max_pool2d_forward_fused(tuple shape, x, in_scale, in_shift, bint in_relu, y):
    cdef mdl_pool2d_shape ps = pool_shape(shape)
    cdef mdl_affine f
    cdef const mdl_affine *fp = affine(&f, in_scale, in_shift, in_relu)
    cdef mdl_status st
    cdef const float *c_x = cptr(x)
    cdef float *m_y = mptr(y)
    with nogil:
        st = mdl_max_pool2d_forward_fused(&ps, c_x, fp, m_y)
    check(st)


def max_pool2d_backward_fused(tuple shape, x, in_scale, in_shift, bint in_relu, dy, dx):
    cdef mdl_pool2d_shape ps = pool_shape(shape)
    cdef mdl_affine f
    cdef const mdl_affine *fp = affine(&f, in_scale, in_shift, in_relu)
    cdef mdl_status st
    cdef const float *c_x = cptr(x)
    cdef const float *c_dy = cptr(dy)
    cdef float *m_dx = mptr(dx)
    with nogil:
        st = mdl_max_pool2d_backward_fused(&ps, c_x, fp, c_dy, m_dx)
    check(st)


POOL_NO_TAP = MDL_POOL_NO_TAP  # the tap of an output that passes no gradient back


def max_pool2d_forward_argmax(tuple shape, x, in_scale, in_shift, bint in_relu, y, tap,
                              bint relu=False):
    cdef mdl_pool2d_shape ps = pool_shape(shape)
    cdef mdl_affine f
    cdef const mdl_affine *fp = affine(&f, in_scale, in_shift, in_relu)
    cdef uint8_t *tp = <uint8_t *>data(tap, cnp.NPY_UINT8, True)
    cdef mdl_status st
    cdef const float *c_x = cptr(x)
    cdef float *m_y = mptr(y)
    with nogil:
        if relu:
            st = mdl_max_pool2d_forward_argmax_relu(&ps, c_x, fp, m_y, tp)
        else:
            st = mdl_max_pool2d_forward_argmax(&ps, c_x, fp, m_y, tp)
    check(st)


def max_pool2d_backward_argmax(tuple shape, tap, dy, dx):
    cdef mdl_pool2d_shape ps = pool_shape(shape)
    cdef const uint8_t *tp = <const uint8_t *>data(tap, cnp.NPY_UINT8, False)
    cdef mdl_status st
    cdef const float *c_dy = cptr(dy)
    cdef float *m_dx = mptr(dx)
    with nogil:
        st = mdl_max_pool2d_backward_argmax(&ps, tp, c_dy, m_dx)
    check(st)


def avg_pool2d_forward(tuple shape, x, y):
    cdef mdl_pool2d_shape ps = pool_shape(shape)
    cdef mdl_status st
    cdef const float *c_x = cptr(x)
    cdef float *m_y = mptr(y)
    with nogil:
        st = mdl_avg_pool2d_forward(&ps, c_x, m_y)
    check(st)


def avg_pool2d_backward(tuple shape, dy, dx, relu_x=None):
    cdef mdl_pool2d_shape ps = pool_shape(shape)
    cdef mdl_status st
    cdef const float *c_dy = cptr(dy)
    cdef float *m_dx = mptr(dx)
    cdef const float *c_x = cptr(relu_x)
    with nogil:
        if relu_x is None:
            st = mdl_avg_pool2d_backward(&ps, c_dy, m_dx)
        else:
            st = mdl_avg_pool2d_backward_relu(&ps, c_x, c_dy, m_dx)
    check(st)


def global_avg_pool2d_forward(int64_t n, int64_t c, int64_t h, int64_t w, x, y):
    cdef mdl_status st
    cdef const float *c_x = cptr(x)
    cdef float *m_y = mptr(y)
    with nogil:
        st = mdl_global_avg_pool2d_forward(n, c, h, w, c_x, m_y)
    check(st)


def global_avg_pool2d_backward(int64_t n, int64_t c, int64_t h, int64_t w, dy, dx):
    cdef mdl_status st
    cdef const float *c_dy = cptr(dy)
    cdef float *m_dx = mptr(dx)
    with nogil:
        st = mdl_global_avg_pool2d_backward(n, c, h, w, c_dy, m_dx)
    check(st)


# ---- elementwise --------------------------------------------------------------

def relu_forward(x, y):
    cdef mdl_status st
    cdef const float *c_x = cptr(x)
    cdef float *m_y = mptr(y)
    cdef int64_t n_x = size(x)
    with nogil:
        st = mdl_relu_forward(n_x, c_x, m_y)
    check(st)


def relu_backward(x, dy, dx):
    cdef mdl_status st
    cdef const float *c_x = cptr(x)
    cdef const float *c_dy = cptr(dy)
    cdef float *m_dx = mptr(dx)
    cdef int64_t n_x = size(x)
    with nogil:
        st = mdl_relu_backward(n_x, c_x, c_dy, m_dx)
    check(st)


def add(a, b, y):
    cdef mdl_status st
    cdef const float *c_a = cptr(a)
    cdef const float *c_b = cptr(b)
    cdef float *m_y = mptr(y)
    cdef int64_t n_a = size(a)
    with nogil:
        st = mdl_add(n_a, c_a, c_b, m_y)
    check(st)


def affine_add(int64_t n, int64_t c, int64_t hw, a, a_scale, a_shift, bint a_relu, b, b_scale,
               b_shift, bint b_relu, bint relu, y):
    cdef mdl_affine fa, fb
    cdef const mdl_affine *pa = affine(&fa, a_scale, a_shift, a_relu)
    cdef const mdl_affine *pb = affine(&fb, b_scale, b_shift, b_relu)
    cdef mdl_status st
    cdef const float *c_a = cptr(a)
    cdef const float *c_b = cptr(b)
    cdef float *m_y = mptr(y)
    with nogil:
        st = mdl_affine_add(n, c, hw, c_a, pa, c_b, pb, relu, m_y)
    check(st)


def dropout_forward(float p, uint64_t seed, x, y):
    cdef mdl_status st
    cdef const float *c_x = cptr(x)
    cdef float *m_y = mptr(y)
    cdef int64_t n_x = size(x)
    with nogil:
        st = mdl_dropout_forward(n_x, p, seed, c_x, m_y)
    check(st)


def dropout_backward(float p, uint64_t seed, dy, dx):
    cdef mdl_status st
    cdef const float *c_dy = cptr(dy)
    cdef float *m_dx = mptr(dx)
    cdef int64_t n_dy = size(dy)
    with nogil:
        st = mdl_dropout_backward(n_dy, p, seed, c_dy, m_dx)
    check(st)


# ---- batch norm ---------------------------------------------------------------

def batch_norm_forward_train(int64_t n, int64_t c, int64_t hw, x, gamma, beta, float eps,
                             float momentum, running_mean, running_var, y, save_mean, save_invstd):
    cdef mdl_status st
    cdef const float *c_x = cptr(x)
    cdef const float *c_gamma = cptr(gamma)
    cdef const float *c_beta = cptr(beta)
    cdef float *m_running_mean = mptr(running_mean)
    cdef float *m_running_var = mptr(running_var)
    cdef float *m_y = mptr(y)
    cdef float *m_save_mean = mptr(save_mean)
    cdef float *m_save_invstd = mptr(save_invstd)
    with nogil:
        st = mdl_batch_norm_forward_train(n, c, hw, c_x, c_gamma, c_beta, eps, momentum,
                                          m_running_mean, m_running_var, m_y, m_save_mean,
                                          m_save_invstd)
    check(st)


def batch_norm_forward_infer(int64_t n, int64_t c, int64_t hw, x, gamma, beta, running_mean,
                             running_var, float eps, y):
    cdef mdl_status st
    cdef const float *c_x = cptr(x)
    cdef const float *c_gamma = cptr(gamma)
    cdef const float *c_beta = cptr(beta)
    cdef const float *c_running_mean = cptr(running_mean)
    cdef const float *c_running_var = cptr(running_var)
    cdef float *m_y = mptr(y)
    with nogil:
        st = mdl_batch_norm_forward_infer(n, c, hw, c_x, c_gamma, c_beta, c_running_mean,
                                          c_running_var, eps, m_y)
    check(st)


def batch_norm_backward(int64_t n, int64_t c, int64_t hw, x, gamma, dy, save_mean, save_invstd, dx,
                        dgamma, dbeta, bint accumulate=False):
    cdef mdl_status st
    cdef const float *c_x = cptr(x)
    cdef const float *c_gamma = cptr(gamma)
    cdef const float *c_dy = cptr(dy)
    cdef const float *c_save_mean = cptr(save_mean)
    cdef const float *c_save_invstd = cptr(save_invstd)
    cdef float *m_dx = mptr(dx)
    cdef float *m_dgamma = mptr(dgamma)
    cdef float *m_dbeta = mptr(dbeta)
    with nogil:
        st = mdl_batch_norm_backward(n, c, hw, c_x, c_gamma, c_dy, c_save_mean, c_save_invstd,
                                     m_dx, m_dgamma, m_dbeta, accumulate)
    check(st)


def batch_norm_stats(int64_t c, int64_t count, channel_sum, channel_sumsq, gamma, beta, float eps,
                     float momentum, running_mean, running_var, save_mean, save_invstd, scale,
                     shift):
    cdef mdl_status st
    cdef const double *cs = <const double *>data(channel_sum, cnp.NPY_FLOAT64, False)
    cdef const double *css = <const double *>data(channel_sumsq, cnp.NPY_FLOAT64, False)
    cdef const float *c_gamma = cptr(gamma)
    cdef const float *c_beta = cptr(beta)
    cdef float *m_running_mean = mptr(running_mean)
    cdef float *m_running_var = mptr(running_var)
    cdef float *m_save_mean = mptr(save_mean)
    cdef float *m_save_invstd = mptr(save_invstd)
    cdef float *m_scale = mptr(scale)
    cdef float *m_shift = mptr(shift)
    with nogil:
        st = mdl_batch_norm_stats(c, count, cs, css, c_gamma, c_beta, eps, momentum,
                                  m_running_mean, m_running_var, m_save_mean, m_save_invstd,
                                  m_scale, m_shift)
    check(st)


def batch_norm_relu_backward(int64_t n, int64_t c, int64_t hw, x, gamma, dy, save_mean,
                             save_invstd, scale, shift, dx, dgamma, dbeta, bint accumulate=False):
    cdef mdl_status st
    cdef const float *c_x = cptr(x)
    cdef const float *c_gamma = cptr(gamma)
    cdef const float *c_dy = cptr(dy)
    cdef const float *c_save_mean = cptr(save_mean)
    cdef const float *c_save_invstd = cptr(save_invstd)
    cdef const float *c_scale = cptr(scale)
    cdef const float *c_shift = cptr(shift)
    cdef float *m_dx = mptr(dx)
    cdef float *m_dgamma = mptr(dgamma)
    cdef float *m_dbeta = mptr(dbeta)
    with nogil:
        st = mdl_batch_norm_relu_backward(n, c, hw, c_x, c_gamma, c_dy, c_save_mean, c_save_invstd,
                                          c_scale, c_shift, m_dx, m_dgamma, m_dbeta, accumulate)
    check(st)


def batch_norm_add_relu_backward(int64_t n, int64_t c, int64_t hw, s, b, b_scale, b_shift,
                                 bint b_relu, gamma, beta, dy, save_invstd, dx, db, dgamma, dbeta,
                                 bint accumulate=False):
    cdef mdl_affine fb
    cdef const mdl_affine *pb = affine(&fb, b_scale, b_shift, b_relu)
    cdef mdl_status st
    cdef const float *c_s = cptr(s)
    cdef const float *c_b = cptr(b)
    cdef const float *c_gamma = cptr(gamma)
    cdef const float *c_beta = cptr(beta)
    cdef const float *c_dy = cptr(dy)
    cdef const float *c_save_invstd = cptr(save_invstd)
    cdef float *m_dx = mptr(dx)
    cdef float *m_db = mptr(db)
    cdef float *m_dgamma = mptr(dgamma)
    cdef float *m_dbeta = mptr(dbeta)
    with nogil:
        st = mdl_batch_norm_add_relu_backward(n, c, hw, c_s, c_b, pb, c_gamma, c_beta, c_dy,
                                              c_save_invstd, m_dx, m_db, m_dgamma, m_dbeta,
                                              accumulate)
    check(st)

# ---- linear -------------------------------------------------------------------

def linear_workspace_size(int64_t n, int64_t in_, int64_t out):
    return mdl_linear_workspace_size(n, in_, out)


def linear_forward(int64_t n, int64_t in_, int64_t out, x, w, b, y, ws=None):
    cdef mdl_status st
    cdef const float *c_x = cptr(x)
    cdef const float *c_w = cptr(w)
    cdef const float *c_b = cptr(b)
    cdef float *m_y = mptr(y)
    cdef void *w_ws = mptr(ws)
    cdef size_t nb_ws = nbytes(ws)
    with nogil:
        st = mdl_linear_forward(n, in_, out, c_x, c_w, c_b, m_y, w_ws, nb_ws)
    check(st)


def linear_backward_data(int64_t n, int64_t in_, int64_t out, dy, w, dx, ws=None):
    cdef mdl_status st
    cdef const float *c_dy = cptr(dy)
    cdef const float *c_w = cptr(w)
    cdef float *m_dx = mptr(dx)
    cdef void *w_ws = mptr(ws)
    cdef size_t nb_ws = nbytes(ws)
    with nogil:
        st = mdl_linear_backward_data(n, in_, out, c_dy, c_w, m_dx, w_ws, nb_ws)
    check(st)


def linear_backward_weights(int64_t n, int64_t in_, int64_t out, x, dy, dw, db,
                            bint accumulate=False, ws=None):
    cdef mdl_status st
    cdef const float *c_x = cptr(x)
    cdef const float *c_dy = cptr(dy)
    cdef float *m_dw = mptr(dw)
    cdef float *m_db = mptr(db)
    cdef void *w_ws = mptr(ws)
    cdef size_t nb_ws = nbytes(ws)
    with nogil:
        st = mdl_linear_backward_weights(n, in_, out, c_x, c_dy, m_dw, m_db, accumulate, w_ws,
                                         nb_ws)
    check(st)


# ---- loss ---------------------------------------------------------------------

def softmax_cross_entropy(int64_t n, int64_t classes, logits, labels, dlogits):
    cdef mdl_status st
    cdef float loss = 0
    cdef const int64_t *lp = <const int64_t *>data(labels, cnp.NPY_INT64, False)
    cdef const float *c_logits = cptr(logits)
    cdef float *m_dlogits = mptr(dlogits)
    with nogil:
        st = mdl_softmax_cross_entropy(n, classes, c_logits, lp, &loss, m_dlogits)
    check(st)
    return loss


# ---- optimizers ---------------------------------------------------------------

def sgd_step(param, grad, momentum_buf, float lr, float momentum, float dampening,
             float weight_decay, bint nesterov, bint first_step):
    cdef mdl_status st
    cdef float *m_param = mptr(param)
    cdef const float *c_grad = cptr(grad)
    cdef float *m_momentum_buf = mptr(momentum_buf)
    cdef int64_t n_param = size(param)
    with nogil:
        st = mdl_sgd_step(n_param, m_param, c_grad, m_momentum_buf, lr, momentum, dampening,
                          weight_decay, nesterov, first_step)
    check(st)


def adam_step(param, grad, exp_avg, exp_avg_sq, int64_t step, float lr, float beta1, float beta2,
              float eps, float weight_decay, bint decoupled):
    cdef mdl_status st
    cdef float *m_param = mptr(param)
    cdef const float *c_grad = cptr(grad)
    cdef float *m_exp_avg = mptr(exp_avg)
    cdef float *m_exp_avg_sq = mptr(exp_avg_sq)
    cdef int64_t n_param = size(param)
    with nogil:
        st = mdl_adam_step(n_param, m_param, c_grad, m_exp_avg, m_exp_avg_sq, step, lr, beta1,
                           beta2, eps, weight_decay, decoupled)
    check(st)
