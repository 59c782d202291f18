/* linear.c -- placeholder: not implemented yet. */
#include "common.h"

size_t mdl_linear_workspace_size(int64_t n, int64_t in, int64_t out) { return 0; }

mdl_status mdl_linear_forward(int64_t n, int64_t in, int64_t out, const float *x, const float *w, const float *b, float *y, void *workspace, size_t workspace_bytes)
{
    return mdl_error(MDL_ERR_UNSUPPORTED, "mdl_linear_forward: not implemented");
}

mdl_status mdl_linear_backward_data(int64_t n, int64_t in, int64_t out, const float *dy, const float *w, float *dx, void *workspace, size_t workspace_bytes)
{
    return mdl_error(MDL_ERR_UNSUPPORTED, "mdl_linear_backward_data: not implemented");
}

mdl_status mdl_linear_backward_weights(int64_t n, int64_t in, int64_t out, const float *x, const float *dy, float *dw, float *db, int accumulate, void *workspace, size_t workspace_bytes)
{
    return mdl_error(MDL_ERR_UNSUPPORTED, "mdl_linear_backward_weights: not implemented");
}
