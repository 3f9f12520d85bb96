/* How many 512-bit instructions of the kinds the decode kernels mix one core issues per unit of
 * time, alone and mixed: eight independent instructions per loop iteration (no dependency
 * chains), 10^8 iterations each.
 *
 *   gcc -O2 -mavx512f -mavx512bw -mavx512vbmi -mavx512bf16 -mavx512vnni benchmarks/vector_issue_rates.c \
 *       -o /tmp/vector_issue_rates && /tmp/vector_issue_rates
 *
 * Prints ns per instruction and the rate relative to vpaddd (which Zen 4 issues two per cycle at
 * 512 bits): 0.5 = one per cycle. Why it exists: fp8_layout.h's converter was chosen from these
 * rates (on a Zen 4 core vpermi2b, vpshufb, vdpbf16ps and vpdpbusd each issue ~one per cycle and
 * share pipes, so a byte-table conversion costs a dot product per shuffle; an unpack issues
 * ~1.6 per cycle). Only runs where the CPU has the features above. */
#include <stdio.h>
#include <time.h>

#define ITERS 100000000L
#define CLOBBERS "zmm0", "zmm1", "zmm2", "zmm3", "zmm4", "zmm5", "zmm6", "zmm7", "zmm16", "zmm17"
#define R(op, d) op " %%zmm16, %%zmm17, %%zmm" #d ";"
#define EIGHT(op) R(op, 0) R(op, 1) R(op, 2) R(op, 3) R(op, 4) R(op, 5) R(op, 6) R(op, 7)
#define MIX(a, b) R(a, 0) R(b, 4) R(a, 1) R(b, 5) R(a, 2) R(b, 6) R(a, 3) R(b, 7)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define BENCH(name, body)                                                      \
    do {                                                                       \
        double t0 = now();                                                     \
        for (long i = 0; i < ITERS; ++i) __asm__ volatile(body ::: CLOBBERS);  \
        double ns = (now() - t0) / ITERS * 1e9 / 8;                            \
        if (base == 0) base = ns;                                              \
        printf("%-24s %6.3f ns  %5.2f x vpaddd's rate\n", name, ns, base / ns); \
    } while (0)

int main(void) {
    double base = 0;
    __asm__ volatile("vpxord %%zmm16, %%zmm16, %%zmm16; vpxord %%zmm17, %%zmm17, %%zmm17" ::: "zmm16", "zmm17");
    BENCH("vpaddd", EIGHT("vpaddd"));
    BENCH("vpternlogd", EIGHT("vpternlogd $0xF8,"));
    BENCH("vpunpcklbw", EIGHT("vpunpcklbw"));
    BENCH("vpshufb", EIGHT("vpshufb"));
    BENCH("vpermb", EIGHT("vpermb"));
    BENCH("vpermt2b", EIGHT("vpermt2b"));
    BENCH("vdpbf16ps", EIGHT("vdpbf16ps"));
    BENCH("vpdpbusd", EIGHT("vpdpbusd"));
    BENCH("vfmadd231ps", EIGHT("vfmadd231ps"));
    BENCH("vpermt2b + vdpbf16ps", MIX("vpermt2b", "vdpbf16ps"));
    BENCH("vpunpcklbw + vdpbf16ps", MIX("vpunpcklbw", "vdpbf16ps"));
    BENCH("vpaddd + vdpbf16ps", MIX("vpaddd", "vdpbf16ps"));
    return 0;
}
