/* The FMA peak of one core: 12 independent accumulator chains of fused multiply-adds,
 * 8-wide (AVX2) and 16-wide (AVX-512), no memory traffic.
 *   cc -O3 -funroll-loops bench/fma_peak.c -o fma_peak && ./fma_peak
 * (-funroll-loops keeps the accumulators in registers.)  Run one copy per core, at
 * the same time, for the peak of several cores. */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

#define CHAINS 12

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

__attribute__((target("avx2,fma"))) static float fma256(long iters) {
    __m256 acc[CHAINS], b = _mm256_set1_ps(1.0000001f), c = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < CHAINS; i++) acc[i] = _mm256_set1_ps((float)i);
    for (long k = 0; k < iters; k++)
        for (int i = 0; i < CHAINS; i++) acc[i] = _mm256_fmadd_ps(acc[i], b, c);
    for (int i = 1; i < CHAINS; i++) acc[0] = _mm256_add_ps(acc[0], acc[i]);
    return _mm256_cvtss_f32(acc[0]);
}

__attribute__((target("avx512f"))) static float fma512(long iters) {
    __m512 acc[CHAINS], b = _mm512_set1_ps(1.0000001f), c = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < CHAINS; i++) acc[i] = _mm512_set1_ps((float)i);
    for (long k = 0; k < iters; k++)
        for (int i = 0; i < CHAINS; i++) acc[i] = _mm512_fmadd_ps(acc[i], b, c);
    for (int i = 1; i < CHAINS; i++) acc[0] = _mm512_add_ps(acc[0], acc[i]);
    return _mm512_reduce_add_ps(acc[0]);
}

int main(void) {
    const long iters = 100000000;
    volatile float sink;
    double best256 = 0, best512 = 0;
    __builtin_cpu_init();
    for (int r = 0; r < 5; r++) {
        double t = now();
        sink = fma256(iters);
        double g = iters * CHAINS * 8 * 2 / (now() - t) / 1e9;
        best256 = g > best256 ? g : best256;
        if (__builtin_cpu_supports("avx512f")) {
            t = now();
            sink = fma512(iters);
            g = iters * CHAINS * 16 * 2 / (now() - t) / 1e9;
            best512 = g > best512 ? g : best512;
        }
    }
    (void)sink;
    printf("{\"avx2_gflops\": %.1f, \"avx512_gflops\": %.1f}\n", best256, best512);
    return 0;
}
