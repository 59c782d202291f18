/* mdl_sgemm (NN, m x n x k, or n x n x n) called from C: prints the best GFLOP/s over
 * `secs` seconds.
 * With libminidl built twice, e.g. the K block of the AVX2 kernel changed:
 *   make lib BUILD=/tmp/kc512 OPT="-O3 -DAVX2_KC=512"
 *   cc -O2 -Iinclude bench/sgemm_c.c /tmp/kc512/lib/libminidl.a -fopenmp -lm -o sgemm512
 *   ./sgemm512 2048 1 1.5     (n, threads, seconds; alternate the builds, compare medians)
 *   ./sgemm512 16 12288 144 2 1.5   (m, n, k, threads, seconds)
 * (bench/NOTES.md, "K block again" and "Thin products on Zen 3") */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include "minidl.h"

#define HUGE_PAGE ((size_t)2 << 20)

/* HUGE_PAGE aligned and, as NumPy asks for its large arrays, in transparent huge pages */
static float *alloc(size_t floats) {
    size_t bytes = (floats * sizeof(float) + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    float *p = aligned_alloc(HUGE_PAGE, bytes);
    if (p) madvise(p, bytes, MADV_HUGEPAGE);
    return p;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc != 4 && argc != 6) {
        fprintf(stderr, "usage: %s n threads seconds | %s m n k threads seconds\n",
                argv[0], argv[0]);
        return 2;
    }
    int64_t m = atoll(argv[1]), n = m, k = m;
    if (argc == 6) {
        n = atoll(argv[2]);
        k = atoll(argv[3]);
    }
    mdl_set_num_threads(atoi(argv[argc - 2]));
    double secs = atof(argv[argc - 1]);
    float *a = alloc((size_t)(m * k)), *b = alloc((size_t)(k * n)), *c = alloc((size_t)(m * n));
    size_t ws = mdl_sgemm_workspace_size(m, n, k);
    void *w = malloc(ws ? ws : 1);
    if (!a || !b || !c || !w) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    for (int64_t i = 0; i < m * k; i++)
        a[i] = (float)(i % 7) * 0.1f;
    for (int64_t i = 0; i < k * n; i++)
        b[i] = (float)(i % 5) * 0.1f;
    for (int i = 0; i < 3; i++)
        mdl_sgemm(0, 0, m, n, k, 1, a, k, b, n, 0, c, n, w, ws);
    double best = 1e30, t0 = now();
    while (now() - t0 < secs) {
        double s = now();
        mdl_sgemm(0, 0, m, n, k, 1, a, k, b, n, 0, c, n, w, ws);
        double d = now() - s;
        if (d < best) best = d;
    }
    printf("%.1f\n", 2.0 * m * n * k / best * 1e-9);
    free(a); free(b); free(c); free(w);
    return 0;
}
