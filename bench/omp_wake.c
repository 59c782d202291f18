/* How long an OpenMP region takes after the process has been idle: each thread does
 * about 0.1 ms of arithmetic, after sleeps of 0 to 0.3 s.  Prints, per idle gap, the
 * region's mean and largest time over 9 tries and when the last thread started its
 * share (a late start: the thread was not running when the region began).
 *   cc -O2 -fopenmp bench/omp_wake.c -o omp_wake && OMP_NUM_THREADS=2 ./omp_wake
 * (compare GOMP_SPINCOUNT=N or OMP_WAIT_POLICY=passive; bench/NOTES.md) */
#include <omp.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(void) {
    static const double gaps[] = {0, 0.001, 0.01, 0.03, 0.1, 0.3};
    volatile double sink = 0;
#pragma omp parallel
    sink += 1; /* start the threads */
    for (int g = 0; g < (int)(sizeof gaps / sizeof gaps[0]); g++) {
        double sum = 0, worst = 0, late = 0;
        for (int r = 0; r < 9; r++) {
            usleep((useconds_t)(gaps[g] * 1e6));
            double t0 = now(), last_start = 0;
#pragma omp parallel reduction(max : last_start)
            {
                last_start = now() - t0;
                double x = 0;
                for (int i = 0; i < 100000; i++) x += i * 1e-9;
                sink += x;
            }
            double dt = now() - t0;
            sum += dt;
            worst = dt > worst ? dt : worst;
            late += last_start;
        }
        printf("idle %5.3f s: region %.3f ms mean, %.3f max; last thread started at %.3f ms\n",
               gaps[g], sum / 9 * 1e3, worst * 1e3, late / 9 * 1e3);
    }
    return 0;
}
