/* optim.c -- placeholder: not implemented yet. */
#include "common.h"

mdl_status mdl_sgd_step(int64_t count, float *param, const float *grad, float *momentum_buf, float lr, float momentum, float dampening, float weight_decay, int nesterov, int first_step)
{
    return mdl_error(MDL_ERR_UNSUPPORTED, "mdl_sgd_step: not implemented");
}

mdl_status mdl_adam_step(int64_t count, float *param, const float *grad, float *exp_avg, float *exp_avg_sq, int64_t step, float lr, float beta1, float beta2, float eps, float weight_decay, int decoupled)
{
    return mdl_error(MDL_ERR_UNSUPPORTED, "mdl_adam_step: not implemented");
}
