/* optim.cu -- optimizer steps (SGD with momentum, Adam, AdamW), in place, with
 * PyTorch's torch.optim update rules (as src_c/optim.c): the hyper-parameters
 * are checked and pre-computed on the host exactly as the CPU does, then one
 * thread per element applies the CPU's scalar formula. */
#include <math.h>
#include "common.cuh"
#include "../src_c/checks.h"

namespace {

struct sgd_hp {
    float lr, momentum, one_minus_dampening, weight_decay;
    int nesterov, first_step;
};

struct adam_hp {
    float beta1, beta2;
    float one_minus_beta1, one_minus_beta2;
    float step_size; /* lr / (1 - beta1^step) */
    float bc2_sqrt;  /* sqrt(1 - beta2^step) */
    float eps;
    float weight_decay; /* Adam: added to the gradient as weight_decay * param; 0 for AdamW */
    float decay;        /* AdamW: param *= decay (1 - lr * weight_decay); 1 for Adam */
};

/* param[count] -= lr * d, with d from grad, weight decay and the momentum buffer */
__global__ void sgd_kernel(int64_t count, float *param, const float *grad, float *buf, sgd_hp hp)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x) {
        float d = grad[i];
        if (hp.weight_decay != 0.0f) d = d + hp.weight_decay * param[i];
        if (hp.momentum != 0.0f) {
            float b = hp.first_step ? d : hp.momentum * buf[i] + hp.one_minus_dampening * d;
            buf[i] = b;
            d = hp.nesterov ? d + hp.momentum * b : b;
        }
        param[i] = param[i] - hp.lr * d;
    }
}

/* param, exp_avg, exp_avg_sq [count] updated in place */
__global__ void adam_kernel(int64_t count, float *param, const float *grad, float *exp_avg,
                            float *exp_avg_sq, adam_hp hp)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x) {
        float p = param[i] * hp.decay;
        float g = grad[i];
        if (hp.weight_decay != 0.0f) g = g + hp.weight_decay * p;
        /* exp_avg = lerp(exp_avg, g, 1 - beta1), in the form PyTorch's lerp uses */
        float m = exp_avg[i];
        m = hp.one_minus_beta1 < 0.5f ? m + hp.one_minus_beta1 * (g - m) : g - (g - m) * hp.beta1;
        float v = exp_avg_sq[i] * hp.beta2 + hp.one_minus_beta2 * (g * g);
        float denom = sqrtf(v) / hp.bc2_sqrt + hp.eps;
        exp_avg[i] = m;
        exp_avg_sq[i] = v;
        param[i] = p - hp.step_size * (m / denom);
    }
}

} /* namespace */

mdl_status mdl_cuda_sgd_step(int64_t count, float *param, const float *grad, float *momentum_buf,
                             float lr, float momentum, float dampening, float weight_decay,
                             int nesterov, int first_step, mdl_cuda_stream stream)
{
    mdl_status st = mdl_sgd_check_args(__func__, count, param, grad, momentum_buf, lr, momentum,
                                       dampening, weight_decay, nesterov);
    if (st != MDL_OK || count == 0) return st;
    sgd_hp hp = {lr, momentum, (float)(1.0 - (double)dampening), weight_decay, nesterov != 0,
                 first_step != 0};
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

    /* bias corrections once per call, in double */
    double bc1 = 1.0 - pow((double)beta1, (double)step);
    double bc2 = 1.0 - pow((double)beta2, (double)step);
    adam_hp hp;
    hp.beta1 = beta1;
    hp.beta2 = beta2;
    hp.one_minus_beta1 = (float)(1.0 - (double)beta1);
    hp.one_minus_beta2 = (float)(1.0 - (double)beta2);
    hp.step_size = (float)((double)lr / bc1);
    hp.bc2_sqrt = (float)sqrt(bc2);
    hp.eps = eps;
    hp.weight_decay = decoupled ? 0.0f : weight_decay;
    hp.decay = decoupled ? (float)(1.0 - (double)lr * (double)weight_decay) : 1.0f;
    adam_kernel<<<mdl_ew_blocks(count), MDL_EW_THREADS, 0, stream>>>(count, param, grad, exp_avg,
                                                                     exp_avg_sq, hp);
    return mdl_cuda_launched(__func__);
}
