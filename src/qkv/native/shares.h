/* How the threads of a parallel region share the rows of one product: thread t owns a contiguous share, rows
   [t per, (t + 1) per) in steps of `step` rows, and takes its steps from the front, in order, so it reads its
   part of the weights as one stream (the hardware's prefetch and the products' own run ahead within it). A
   thread whose share is done takes the steps left in the others' shares from their back, so a thread the
   system pauses holds up at most one step, as with a dynamic schedule; but without one that deals steps out
   in turn, each thread's weights come from places far apart (at batch 1, 64-row chunks dealt in turn were
   7% slower than halves, 16-row chunks 25%).

   Each share's progress is one 64-bit word, (steps taken from the back) << 32 | (steps taken from the front),
   changed by compare-and-swap: a step is taken once, by the owner or by another thread. Which thread computes
   a row never changes its numbers. The words start at zero; each product of a step has its own. */

#include <omp.h>
#include <stdint.h>

typedef struct {
    uint64_t taken;
    char pad[56];  /* a cache line each */
} Share;

/* Takes step `index` of a share of `count` steps, from the front (the owner) or the back; 0 if none are left. */
static int take_step(Share *share, int64_t count, int front, int64_t *index) {
    uint64_t old = __atomic_load_n(&share->taken, __ATOMIC_RELAXED);
    for (;;) {
        const uint64_t ahead = old & 0xffffffffu, behind = old >> 32;
        if ((int64_t)(ahead + behind) >= count) return 0;
        const uint64_t next = front ? old + 1 : old + ((uint64_t)1 << 32);
        if (__atomic_compare_exchange_n(&share->taken, &old, next, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
            *index = front ? (int64_t)ahead : count - 1 - (int64_t)behind;
            return 1;
        }
    }
}

/* The calling thread's next rows [*n0, *n1) of n shared in steps of `step` rows (shares: one per thread of
   the region, zeroed), or 0 when every row is taken. *from starts at 0: how many shares this thread has
   finished (its own first, then the next threads' in turn). */
static int next_rows(Share *shares, int64_t n, int64_t step, int *from, int64_t *n0, int64_t *n1) {
    const int threads = omp_get_num_threads(), me = omp_get_thread_num();
    const int64_t steps = (n + step - 1) / step, per = (steps + threads - 1) / threads;
    for (; *from < threads; ++*from) {
        const int owner = (me + *from) % threads;
        const int64_t first = owner * per, count = steps - first < per ? steps - first : per;
        int64_t index;
        if (count > 0 && take_step(&shares[owner], count, *from == 0, &index)) {
            *n0 = (first + index) * step;
            *n1 = *n0 + step < n ? *n0 + step : n;
            return 1;
        }
    }
    return 0;
}
