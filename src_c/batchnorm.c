/* batchnorm.c -- placeholder: not implemented yet. */
#include "common.h"

mdl_status mdl_batch_norm_forward_train(int64_t n, int64_t c, int64_t hw, const float *x, const float *gamma, const float *beta, float eps, float momentum, float *running_mean, float *running_var, float *y, float *save_mean, float *save_invstd)
{
    return mdl_error(MDL_ERR_UNSUPPORTED, "mdl_batch_norm_forward_train: not implemented");
}

mdl_status mdl_batch_norm_forward_infer(int64_t n, int64_t c, int64_t hw, const float *x, const float *gamma, const float *beta, const float *running_mean, const float *running_var, float eps, float *y)
{
    return mdl_error(MDL_ERR_UNSUPPORTED, "mdl_batch_norm_forward_infer: not implemented");
}

mdl_status mdl_batch_norm_backward(int64_t n, int64_t c, int64_t hw, const float *x, const float *gamma, const float *dy, const float *save_mean, const float *save_invstd, float *dx, float *dgamma, float *dbeta, int accumulate)
{
    return mdl_error(MDL_ERR_UNSUPPORTED, "mdl_batch_norm_backward: not implemented");
}
