/* optim.cu -- optimizer steps (SGD with momentum, Adam, AdamW), in place, with
 * PyTorch's torch.optim update rules (as src_c/optim.c): the hyper-parameters
 * are checked and pre-computed on the host exactly as the CPU does, then one
 * thread per element applies the CPU's scalar formula. */
#include <math.h>
#include "common.cuh"
#include "../src_c/checks.h"
#include "../src_c/optim_hp.h"

namespace {

/* param[count] -= lr * d, with d from grad, weight decay and the momentum buffer */
__global__ void sgd_kernel(int64_t count, float *param, const float *grad, float *buf,
                           mdl_sgd_hp hp)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x)
        mdl_sgd_element(i, param, grad, buf, &hp);
}

/* param, exp_avg, exp_avg_sq [count] updated in place */
__global__ void adam_kernel(int64_t count, float *param, const float *grad, float *exp_avg,
                            float *exp_avg_sq, mdl_adam_hp hp)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x)
        mdl_adam_element(i, param, grad, exp_avg, exp_avg_sq, &hp);
}

} /* namespace */

mdl_status mdl_cuda_sgd_step(int64_t count, float *param, const float *grad, float *momentum_buf,
                             float lr, float momentum, float dampening, float weight_decay,
                             int nesterov, int first_step, mdl_cuda_stream stream)
{
    mdl_status st = mdl_sgd_check_args(__func__, count, param, grad, momentum_buf, lr, momentum,
                                       dampening, weight_decay, nesterov);
    if (st != MDL_OK || count == 0) return st;
    mdl_sgd_hp hp = mdl_sgd_hyper(lr, momentum, dampening, weight_decay, nesterov, first_step);
    sgd_kernel<<<mdl_ew_blocks(count), MDL_EW_THREADS, 0, stream>>>(count, param, grad,
                                                                    momentum_buf, hp);
    return mdl_cuda_launched(__func__);
}

mdl_status mdl_cuda_adam_step(int64_t count, float *param, const float *grad, float *exp_avg,
                              float *exp_avg_sq, int64_t step, float lr, float beta1, float beta2,
                              float eps, float weight_decay, int decoupled, mdl_cuda_stream stream)
{
    mdl_status st = mdl_adam_check_args(__func__, count, param, grad, exp_avg, exp_avg_sq, step,
                                        lr, beta1, beta2, eps, weight_decay);
    if (st != MDL_OK || count == 0) return st;

    mdl_adam_hp hp = mdl_adam_hyper(step, lr, beta1, beta2, eps, weight_decay, decoupled);
    adam_kernel<<<mdl_ew_blocks(count), MDL_EW_THREADS, 0, stream>>>(count, param, grad, exp_avg,
                                                                     exp_avg_sq, hp);
    return mdl_cuda_launched(__func__);
}
