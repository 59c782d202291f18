/* mdl_sgemm (NN, n x n x n) called from C: prints the best GFLOP/s over `secs` seconds.
 * With libminidl built twice, e.g. the K block of the AVX2 kernel changed:
 *   make lib BUILD=/tmp/kc512 OPT="-O3 -DAVX2_KC=512"
 *   cc -O2 -Iinclude bench/sgemm_c.c /tmp/kc512/lib/libminidl.a -fopenmp -lm -o sgemm512
 *   ./sgemm512 2048 1 1.5     (n, threads, seconds; alternate the builds, compare medians)
 * (bench/NOTES.md, "K block again") */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "minidl.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s n threads seconds\n", argv[0]);
        return 2;
    }
    int64_t n = atoll(argv[1]);
    double secs = atof(argv[3]);
    mdl_set_num_threads(atoi(argv[2]));
    size_t bytes = (size_t)(n * n) * sizeof(float);
    float *a = malloc(bytes), *b = malloc(bytes), *c = malloc(bytes);
    size_t ws = mdl_sgemm_workspace_size(n, n, n);
    void *w = malloc(ws ? ws : 1);
    if (!a || !b || !c || !w) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    for (int64_t i = 0; i < n * n; i++) {
        a[i] = (float)(i % 7) * 0.1f;
        b[i] = (float)(i % 5) * 0.1f;
    }
    for (int i = 0; i < 3; i++)
        mdl_sgemm(0, 0, n, n, n, 1, a, n, b, n, 0, c, n, w, ws);
    double best = 1e30, t0 = now();
    while (now() - t0 < secs) {
        double s = now();
        mdl_sgemm(0, 0, n, n, n, 1, a, n, b, n, 0, c, n, w, ws);
        double d = now() - s;
        if (d < best) best = d;
    }
    printf("%.1f\n", 2.0 * n * n * n / best * 1e-9);
    free(a); free(b); free(c); free(w);
    return 0;
}
