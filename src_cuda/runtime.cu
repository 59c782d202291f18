/* runtime.cu -- per-thread error messages, launch checks, devices, synchronisation. */
#include <stdarg.h>
#include <stdio.h>
#include "common.cuh"

static thread_local char last_error[512];

const char *mdl_cuda_last_error(void) { return last_error; }

mdl_status mdl_cuda_error(mdl_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

static mdl_status from_cuda(cudaError_t e, const char *fn)
{
    if (e == cudaSuccess) return MDL_OK;
    return mdl_cuda_error(e == cudaErrorMemoryAllocation ? MDL_ERR_ALLOC : MDL_ERR_DEVICE,
                          "%s: CUDA error %d (%s): %s", fn, (int)e, cudaGetErrorName(e),
                          cudaGetErrorString(e));
}

mdl_status mdl_cuda_launched(const char *fn) { return from_cuda(cudaGetLastError(), fn); }

mdl_status mdl_cuda_device_count(int *n)
{
    MDL_CHECK_PTR(n);
    *n = 0;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) {
        (void)cudaGetLastError(); /* clear it: not an error of later calls */
        mdl_cuda_error(MDL_OK, "mdl_cuda_device_count: no CUDA device: %s", cudaGetErrorString(e));
        return MDL_OK;
    }
    if (e != cudaSuccess) return from_cuda(e, __func__);
    *n = count;
    return MDL_OK;
}

mdl_status mdl_cuda_synchronize(mdl_cuda_stream stream)
{
    return from_cuda(cudaStreamSynchronize(stream), __func__);
}
