/* pool.c -- placeholder: not implemented yet. */
#include "common.h"

mdl_status mdl_pool2d_output_size(const mdl_pool2d_shape *s, int64_t *h_out, int64_t *w_out)
{
    return mdl_error(MDL_ERR_UNSUPPORTED, "mdl_pool2d_output_size: not implemented");
}

mdl_status mdl_max_pool2d_forward(const mdl_pool2d_shape *s, const float *x, float *y)
{
    return mdl_error(MDL_ERR_UNSUPPORTED, "mdl_max_pool2d_forward: not implemented");
}

mdl_status mdl_max_pool2d_backward(const mdl_pool2d_shape *s, const float *x, const float *dy, float *dx)
{
    return mdl_error(MDL_ERR_UNSUPPORTED, "mdl_max_pool2d_backward: not implemented");
}

mdl_status mdl_avg_pool2d_forward(const mdl_pool2d_shape *s, const float *x, float *y)
{
    return mdl_error(MDL_ERR_UNSUPPORTED, "mdl_avg_pool2d_forward: not implemented");
}

mdl_status mdl_avg_pool2d_backward(const mdl_pool2d_shape *s, const float *dy, float *dx)
{
    return mdl_error(MDL_ERR_UNSUPPORTED, "mdl_avg_pool2d_backward: not implemented");
}

mdl_status mdl_global_avg_pool2d_forward(int64_t n, int64_t c, int64_t h, int64_t w, const float *x, float *y)
{
    return mdl_error(MDL_ERR_UNSUPPORTED, "mdl_global_avg_pool2d_forward: not implemented");
}

mdl_status mdl_global_avg_pool2d_backward(int64_t n, int64_t c, int64_t h, int64_t w, const float *dy, float *dx)
{
    return mdl_error(MDL_ERR_UNSUPPORTED, "mdl_global_avg_pool2d_backward: not implemented");
}
