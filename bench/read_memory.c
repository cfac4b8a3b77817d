/* A plain read of memory for bench/qkv_peer.py's bandwidth reference: the sum of n floats on `threads` threads,
   each reading its contiguous share 64 floats (four 16-float vectors, four chains of sums) at a time and asking
   the memory for the line 8 KB ahead. What a kernel that does nothing but read can stream: torch.sum read 20-24
   GB/s on the 2-core Intel VM of 2026-11-27 where this loop read 23-36. Built by qkv_peer with qkv's compiler
   and flags. */

#include <omp.h>
#include <stdint.h>
#include <string.h>

typedef float vf __attribute__((vector_size(64)));

double qkv_bench_read(const float *a, int64_t n, int32_t threads) {
    double total = 0.0;
#pragma omp parallel for schedule(static) num_threads(threads) reduction(+ : total)
    for (int64_t c = 0; c < n / 4096; c++) {
        vf s[4] = {{0}, {0}, {0}, {0}};
        const float *p = a + c * 4096;
        for (int64_t i = 0; i < 4096; i += 64) {
            __builtin_prefetch(p + i + 2048, 0, 3);
            for (int k = 0; k < 4; k++) {
                vf v;
                memcpy(&v, p + i + 16 * k, sizeof v);
                s[k] += v;
            }
        }
        const vf t = (s[0] + s[1]) + (s[2] + s[3]);
        for (int k = 0; k < 16; k++) total += t[k];
    }
    return total;
}
