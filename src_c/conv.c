/* conv.c -- placeholder: not implemented yet. */
#include "common.h"

mdl_status mdl_conv2d_output_size(const mdl_conv2d_shape *s, int64_t *h_out, int64_t *w_out)
{
    return mdl_error(MDL_ERR_UNSUPPORTED, "mdl_conv2d_output_size: not implemented");
}

size_t mdl_conv2d_workspace_size(const mdl_conv2d_shape *s) { return 0; }

mdl_status mdl_conv2d_forward(const mdl_conv2d_shape *s, const float *x, const float *w, const float *bias, float *y, void *workspace, size_t workspace_bytes)
{
    return mdl_error(MDL_ERR_UNSUPPORTED, "mdl_conv2d_forward: not implemented");
}

mdl_status mdl_conv2d_backward_data(const mdl_conv2d_shape *s, const float *dy, const float *w, float *dx, void *workspace, size_t workspace_bytes)
{
    return mdl_error(MDL_ERR_UNSUPPORTED, "mdl_conv2d_backward_data: not implemented");
}

mdl_status mdl_conv2d_backward_weights(const mdl_conv2d_shape *s, const float *x, const float *dy, float *dw, int accumulate, void *workspace, size_t workspace_bytes)
{
    return mdl_error(MDL_ERR_UNSUPPORTED, "mdl_conv2d_backward_weights: not implemented");
}

mdl_status mdl_conv2d_backward_bias(const mdl_conv2d_shape *s, const float *dy, float *db, int accumulate)
{
    return mdl_error(MDL_ERR_UNSUPPORTED, "mdl_conv2d_backward_bias: not implemented");
}
