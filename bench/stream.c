/* STREAM-style copy and triad on float arrays with OpenMP, for bench_membound.py
 * (compiled there into a temporary shared library and called through ctypes).
 *   copy:  a[i] = b[i]              2 x 4 bytes per element
 *   triad: a[i] = b[i] + s * c[i]   3 x 4 bytes per element
 * Plain (write-allocate) stores, as minidl's kernels use, and STREAM's byte
 * count (the read for ownership of a is not counted).  Each thread works on
 * its own contiguous share; the caller times the call. */
#include <stdint.h>

void stream_copy(float *restrict a, const float *restrict b, int64_t n, int threads)
{
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t i = 0; i < n; i++) a[i] = b[i];
}

void stream_triad(float *restrict a, const float *restrict b, const float *restrict c,
                  float s, int64_t n, int threads)
{
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t i = 0; i < n; i++) a[i] = b[i] + s * c[i];
}
