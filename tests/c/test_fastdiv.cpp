/* test_fastdiv.cpp -- src_cuda/fastdiv.cuh's quotients against `/`, on the host:
 * every divisor below 20000 and every power of two and its neighbours below 2^30
 * (with random dividends, the multiples of the divisor and their neighbours, and
 * 2^31 - 1), then random divisors below 2^30.  Prints the first mismatches; exit
 * status 0 = pass. */
#include <stdio.h>
#include <random>
#include "../../src_cuda/fastdiv.cuh"

static long checks, wrong;

static void check(int d, int64_t q)
{
    if (q < 0 || q > 2147483647) return;
    checks++;
    if (mdl_fastdiv(d).div((int)q) != (int)(q / d) && wrong++ < 5)
        printf("FAIL %lld / %d: %d, want %lld\n", (long long)q, d, mdl_fastdiv(d).div((int)q),
               (long long)(q / d));
}

static void around_multiples(int d, std::mt19937_64 &r, int randoms)
{
    for (int t = 0; t < randoms; t++) check(d, (int64_t)(r() % 2147483648ULL));
    for (int64_t k : {0LL, 1LL, 2LL, 1000LL, 2147483647LL / d})
        for (int e = -1; e <= 1; e++) check(d, k * d + e);
    check(d, 2147483647);
}

int main()
{
    std::mt19937_64 r(1);
    for (int d = 1; d < 20000; d++) around_multiples(d, r, 20);
    for (int l = 0; l < 30; l++)
        for (int e = -1; e <= 1; e++)
            if ((1LL << l) + e >= 1) around_multiples((int)((1LL << l) + e), r, 1000);
    for (int t = 0; t < 200000; t++) around_multiples(1 + (int)(r() % 1073741823ULL), r, 1);
    printf("%ld quotients, %ld wrong\n", checks, wrong);
    return wrong != 0;
}
