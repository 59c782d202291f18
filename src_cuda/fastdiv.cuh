/* fastdiv.cuh -- internal: division by a divisor fixed at launch, as a multiply and a
 * shift (the GPU has no integer divide instruction: a `/` by a run-time int costs
 * about 20 instructions).  Host code makes it, kernels divide with it; it also
 * compiles as plain C++ (tests/c/test_fastdiv.cpp checks it against `/`).
 *
 * q / d for 0 <= q < 2^31 and 1 <= d < 2^31: with l = ceil(log2 d) and s = 31 + l,
 * m = ceil(2^s / d) is below 2^32, and q * m / 2^s exceeds q / d by less than
 * q / 2^s < 2^-l <= 1 / d, too little to reach the next integer, so the floors agree. */
#ifndef MDL_CUDA_FASTDIV_CUH
#define MDL_CUDA_FASTDIV_CUH

#include <stdint.h>

#ifdef __CUDACC__
#define MDL_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define MDL_HOST_DEVICE inline
#endif

struct mdl_fastdiv {
    uint32_t m;
    int s;
    mdl_fastdiv() = default;
    explicit mdl_fastdiv(int d) /* d < 1 (an empty extent, never divided by) counts as 1 */
    {
        if (d < 1) d = 1;
        int l = 0;
        while ((1LL << l) < d) l++;
        s = 31 + l;
        m = (uint32_t)(((1ULL << s) + (uint64_t)d - 1) / (uint64_t)d);
    }
    MDL_HOST_DEVICE int div(int q) const { return (int)(((uint64_t)(uint32_t)q * m) >> s); }
};

#endif /* MDL_CUDA_FASTDIV_CUH */
