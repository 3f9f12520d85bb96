/* Sustained read bandwidth with N threads: each OpenMP thread sums its own contiguous slice of
 * a buffer much larger than the last-level cache, touched first by the same thread.
 * moe_layer.py compiles it on the fly:  gcc -O3 -march=native -fopenmp stream_read.c
 *
 *   stream_read THREADS MIB PASSES [huge|small]   ->  one line of JSON: GB/s per pass (1 GB = 1e9 bytes)
 *
 * huge (default): the buffer is madvise(MADV_HUGEPAGE)d, as kt's NUMA allocator does for expert
 * weights; with transparent huge pages in "madvise" mode this is worth ~30 % here (TLB misses).
 * small: plain 4 KiB pages, what an allocator that does not ask for huge pages streams from.
 *
 * Why C and not torch.sum: the number is the ceiling the MoE kernels are compared against, so it
 * must be a plain load stream with a known thread count, no framework dispatch and no extra
 * threads; the integer sum vectorises to full-width loads and cannot be skipped by the compiler
 * because the result is printed. */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

int main(int argc, char **argv) {
    if (argc != 4 && argc != 5) {
        fprintf(stderr, "usage: %s THREADS MIB PASSES [huge|small]\n", argv[0]);
        return 2;
    }
    const int threads = atoi(argv[1]);
    const size_t bytes = (size_t)atol(argv[2]) << 20;
    const int passes = atoi(argv[3]);
    const size_t n = bytes / sizeof(uint64_t);
    uint64_t *buf = NULL;
    if (threads < 1 || passes < 1 || posix_memalign((void **)&buf, 2u << 20, n * sizeof(uint64_t)) != 0) {
        fprintf(stderr, "bad arguments or out of memory\n");
        return 1;
    }
    const int huge = argc < 5 || strcmp(argv[4], "small") != 0;
    if (huge) madvise(buf, n * sizeof(uint64_t), MADV_HUGEPAGE); /* advice only: THP may be off */
    omp_set_num_threads(threads);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; ++i) buf[i] = i * 0x9E3779B97F4A7C15ull;

    uint64_t check = 0;
    printf("{\"threads\": %d, \"mib\": %zu, \"pages\": \"%s\", \"gbps\": [", threads, bytes >> 20,
           huge ? "huge" : "small");
    for (int p = 0; p < passes; ++p) {
        uint64_t total = 0;
        const double t0 = omp_get_wtime();
#pragma omp parallel for schedule(static) reduction(+ : total)
        for (size_t i = 0; i < n; ++i) total += buf[i];
        const double dt = omp_get_wtime() - t0;
        check += total;
        printf("%s%.3f", p ? ", " : "", (double)bytes / dt / 1e9);
    }
    printf("], \"checksum\": %llu}\n", (unsigned long long)check);
    free(buf);
    return 0;
}
