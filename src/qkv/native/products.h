/* Matrix products y = W x + b for B input vectors (B <= MAX_ROWS) over one thread's slice of W's rows.

   Decoding reads every weight once per step to do 2 B flops with it, so these loops stream W once, from the
   first row of the slice to the last, and use each weight loaded for all B vectors. Five kinds of matrix
   (struct Mat, kind):

     MAT_F32   float32 W (n, k)                                     y = W x
     MAT_I8    int8 Q (n, k), float32 scale s (n,)                  y = s (Q x)                    x in float32, or
                                                                    (int8_bf16(), k a multiple of 32) in bfloat16
     MAT_I8A8  the same Q and s                                     y = s sum_c d_c (Q_c xq_c)     x in int8 blocks
     (either, group > 0: s float32 (n, k / group), a scale per group of `group` columns (a multiple of 32):
      MAT_I8 y = sum_j (s_j//group Q_j) x_j, each 16 weights scaled before their FMAs; MAT_I8A8
      y = sum_c s_c d_c (Q_c xq_c), s_c the scale of block c's group)
     MAT_I4    4-bit levels (n, k / 2 bytes: column 2j in the low    y = sum_c s_c d_c (Q_c xq_c)
               nibble of byte j, 2j + 1 in the high one), float16       + sum_c m_c d_c sum(xq_c)
               scale s and minimum m per group of `group` columns
     MAT_I4F   the same                                             y = sum_j (s q_j + m) x_j      x in float32

   MAT_I8A8 and MAT_I4 round x to int8 in blocks c of 32 values, xq_c = round(x_c / d_c) with d_c = max|x_c| / 127,
   as llama.cpp's Q8 products do: a block's rounding error is at most d_c / 2, so one large activation
   (small models have a few, in fixed channels) spoils only its own block. The integer dot products of a
   block are exact (AVX-512 VNNI, 64 byte products per instruction); each block's sum is then scaled in
   float32. The mins of MAT_I4 multiply each block's sum of its rounded values, d_c sum(xq_c), as llama.cpp's
   Q8_1 does: then y = sum_c sum_j (s q_j + m) d_c xq_j, the dequantized weights times the rounded x, whose
   errors (s q_j + m) e_j are centred on zero. With the exact float sum the error would be s q_j e_j with q_j
   in 0..15, about twice as large (docs/generation.md, "Against llama.cpp", has what it cost). With Mat.slices 2
   (activations "int8x2") x is rounded twice: what the first rounding missed, r_c = x_c - d_c xq_c, is rounded
   the same way into the vectors Input.second on, and the product adds W times it, the weights read once (the
   16-row kernels in the same pass, the others row by row from the cache): x's error falls from d_c / 2 to
   d'_c / 2 <= d_c / 508, at twice the integer dot products.

   The inputs are prepared once per vector (struct Input, prepare_input): x itself; its blocks' scales d, its
   int8 levels in column order as xq + 128 (MAT_I8A8: VNNI multiplies unsigned bytes by signed ones; the product
   subtracts 128 times each block's weight sum, once per row for every vector), and in the order of the 4-bit bytes, each block's 16 even
   columns then its 16 odd ones (MAT_I4, whose levels 0..15 are the unsigned side); d_c sum(xq_c) of each
   block; x in bfloat16 (MAT_I8 where int8_bf16()). Without AVX-512 VNNI the same sums are computed by plain loops. */

#include "vectors.h"
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define HAVE_VNNI 1
#else
#define HAVE_VNNI 0
#endif
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#define I8_BF16 1  /* MAT_I8 can multiply x in bfloat16 (int8_rows.h), where int8_bf16() says it pays */
#else
#define I8_BF16 0
#endif

/* Whether MAT_I8 multiplies x in bfloat16 on this CPU: 1 where AVX512_BF16's dot products outpace float32 FMAs,
   0 where they do not, as the CPU's maker tells. On AMD (Zen 4) a dot product of 32 pairs issues as fast as an FMA
   of 16, and SmolLM2's int8 products at batch 8 took half the time of float32 FMAs; on Intel (Emerald Rapids) one
   issues every 2 cycles where two FMAs issue each cycle, and the float32 rows took 0.6-0.75x the time of the
   bfloat16 ones at batch 1 and 8 (SmolLM2, docs/generation.md). qkv_set_int8_bf16 overrides the choice (tests: 0, 1, or
   -1 for the CPU's). Decided once per process: a product's numbers never change within one. */
static int int8_bf16_choice = -1;

static int int8_bf16(void) {
    if (int8_bf16_choice < 0) {
#if I8_BF16 && (defined(__GNUC__) || defined(__clang__))
        __builtin_cpu_init();
        int8_bf16_choice = __builtin_cpu_is("amd") ? 1 : 0;
#else
        int8_bf16_choice = I8_BF16;
#endif
    }
    return I8_BF16 && int8_bf16_choice;
}

#define MAX_ROWS 8
#define ROW_BLOCK 3  /* rows of a float32 matrix multiplied together (rows_float) */
#define BLOCK 32
/* How far ahead of its loads a product asks the memory for W (the hardware's prefetch lags): float32 rows 4 rows
   ahead (9 KB at 576 columns), int8 and 4-bit ones a distance in bytes, as their rows are 4 and 8 times shorter
   (4 rows of a 576-wide 4-bit matrix, 1.1 KB, left a batch-1 step 9% slower; measured on SmolLM2-135M). */
#ifndef PREFETCH_ROWS
#define PREFETCH_ROWS 4
#endif
#define PREFETCH_INT8 4608
#define PREFETCH_INT4 3456

enum { MAT_F32 = 0, MAT_I8 = 1, MAT_I8A8 = 2, MAT_I4 = 3, MAT_I4F = 4 };

typedef struct {
    int32_t kind, n, k, group;
    const void *w;          /* float32 (n, k) | int8 (n, k) | uint8 (n, k / 2) */
    const float *scale;     /* int8 kinds: (n,) */
    const uint16_t *s16;    /* MAT_I4: float16 (n, k / group) */
    const uint16_t *m16;
    const float *bias;      /* (n,) or NULL */
    const void *lanes;      /* MAT_I4: the levels of each 16 rows repacked (int4_lanes.h), or NULL */
    const uint16_t *lane_s; /* MAT_I4 with lanes: s and m, (n / 16, k / group, 16) */
    const uint16_t *lane_m;
    const float *lane_f;    /* MAT_I8A8 with lanes (int8_lanes.h): the scales per group, (n / 16, k / group, 16) */
    const int32_t *lane_off;/* MAT_I8A8 with lanes: -128 times each block's sum of weights, (n / 16, k / 32, 16) */
    int32_t slices;         /* MAT_I8A8, MAT_I4: 2 when x is rounded twice (x ~ d xq + d' xq', xq' rounding what xq
                               missed: Input.second), else 0 or 1 */
} Mat;

typedef struct {            /* B vectors of k <= kmax values, in every form a product reads */
    const float *x;         /* (B, ldx) */
    int64_t ldx;
    int64_t stride;         /* row stride of the byte arrays: kmax rounded up to 64 */
    uint8_t *offq;          /* (B, stride) xq + 128 in column order (MAT_I8A8) */
    int8_t *swapped;        /* (B, stride) xq, each block's even columns, then its odd ones (MAT_I4) */
    float *fswapped;        /* (B, stride) x in the same order, unrounded (MAT_I4F) */
    float *scales;          /* (B, stride / 64 * 16) per 64 columns: d of the first block x8, the second x8 */
    float *sums;            /* (B, stride / 32) d_c sum(xq_c) of each block */
    uint16_t *xh;           /* (B, stride) x in bfloat16, rounded to nearest even (MAT_I8 where int8_bf16()) */
    int16_t *x16;           /* (B, stride) FINER xq + xq' of x rounded twice (PREPARE_TWO), column order */
    int16_t *x16s;          /* (B, stride) the same in the 4-bit order (as swapped) */
    int32_t second;         /* where vector b's second rounding is prepared (PREPARE_TWO): vector b + second */
} Input;

#include "inputs.h"

/* ------------------------------------------------------------------------------------ one row, B vectors */

#define INLINE static inline __attribute__((always_inline))

/* R rows of a float32 matrix, `ldw` apart, times B vectors: out[r * MAX_ROWS + b]. Each 16 columns of x loaded
   serve the R rows (R x B sums in registers): a one-row loop at batch 8 spends its time loading x, 1.35x slower.
   One chain of sums per row and vector, in the same order whatever R and B are: a vector's result never depends
   on the others (so several tokens of one text in one step get the numbers they would get one step at a time).
   (int8 rows, rows_i8f, take 4 rows at batch 1 and 2: their conversions make fewer chains latency-bound.) */
INLINE void rows_float(const float *w, int64_t ldw, const int R, int64_t k, const Input *in, int B, float *out) {
    vf acc[ROW_BLOCK][MAX_ROWS];
    for (int r = 0; r < R; r++)
        for (int b = 0; b < B; b++) acc[r][b] = (vf){0};
    int64_t j = 0;
    for (; j + LANES <= k; j += LANES) {
        vf a[ROW_BLOCK];
        for (int r = 0; r < R; r++) {
            __builtin_prefetch(w + r * ldw + j + PREFETCH_ROWS * k, 0, 1);  /* a line of weights, rows ahead */
            a[r] = load_f(w + r * ldw + j);
        }
        for (int b = 0; b < B; b++) {
            vf xb = load_f(in->x + b * in->ldx + j);
            for (int r = 0; r < R; r++) acc[r][b] = fmadd(a[r], xb, acc[r][b]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int b = 0; b < B; b++) {
            float sum = hsum(acc[r][b]);
            for (int64_t t = j; t < k; t++) sum += w[r * ldw + t] * in->x[b * in->ldx + t];
            out[r * MAX_ROWS + b] = sum;
        }
}

/* y[b * ldy + i] = (or +=, with add) row i of W x + b, for vector b < B. */
INLINE void store(const Mat *m, int64_t i, const float *out, int B, float *y, int64_t ldy, int add) {
    float bias = m->bias ? m->bias[i] : 0.0f;
    for (int b = 0; b < B; b++) {
        float *dst = y + b * ldy + i;
        *dst = add ? *dst + (out[b] + bias) : out[b] + bias;
    }
}

#include "rows_avx2.h"
#include "int8_rows.h"
#include "int4_rows.h"
#include "int4_lanes.h"
#include "int8_lanes.h"
#include "lanes_avx2.h"

/* ------------------------------------------------------------------------------------- a slice of rows */

/* Rows n0 .. n1-1 of y = W x + b for B vectors. */
INLINE void product_rows(const Mat *m, const Input *in, int B, float *y, int64_t ldy, int64_t n0, int64_t n1,
                         int add) {
    float out[4 * MAX_ROWS];
    const int64_t k = m->k, groups = m->group ? k / m->group : 0;
    const int shift = m->group ? __builtin_ctz((unsigned)(m->group / BLOCK)) : 0;  /* groups of 32 << shift */
#if AVX2
    if (product_rows_avx2(m, in, B, y, ldy, n0, n1, add, out)) return;
#endif
    if (m->kind == MAT_F32) {  /* ROW_BLOCK rows at a time, then the last few one by one */
        for (int64_t i = n0; i < n1;) {
            const float *w = (const float *)m->w + i * k;
            const int R = n1 - i >= ROW_BLOCK ? ROW_BLOCK : 1;
            if (R == ROW_BLOCK) rows_float(w, k, ROW_BLOCK, k, in, B, out);
            else rows_float(w, k, 1, k, in, B, out);
            for (int r = 0; r < R; r++, i++) store(m, i, out + r * MAX_ROWS, B, y, ldy, add);
        }
        return;
    }
    if (m->kind == MAT_I4F) {  /* rows four at a time at batch 1 and 2 (four chains of sums hide the FMAs' latency:
                                  a batch-1 step 10% faster on Emerald Rapids), two at larger batches (2 x 8 sums
                                  fill the registers), then the last few; which rows go together never changes a
                                  row's numbers */
        for (int64_t i = n0; i < n1;) {
            const uint8_t *w = (const uint8_t *)m->w + i * (k / 2);
            const uint16_t *s16 = m->s16 + i * groups, *m16 = m->m16 + i * groups;
            const int R = B <= 2 && n1 - i >= 4 ? 4 : n1 - i >= 2 ? 2 : 1;
            if (R == 4) rows_i4f(w, s16, m16, k, shift, 4, groups, in, B, out);
            else if (R == 2) rows_i4f(w, s16, m16, k, shift, 2, groups, in, B, out);
            else rows_i4f(w, s16, m16, k, shift, 1, groups, in, B, out);
            for (int r = 0; r < R; r++, i++) store(m, i, out + r * MAX_ROWS, B, y, ldy, add);
        }
        return;
    }
    if (m->kind == MAT_I8 && !int8_rows_in_bf16(m)) {  /* x in float32: rows four at a time at batch 1 and 2, two
                                                         beyond (as MAT_I4F) */
        for (int64_t i = n0; i < n1;) {
            const int8_t *w = (const int8_t *)m->w + i * k;
            const float *gs = m->group ? m->scale + i * groups : NULL;
            const int R = B <= 2 && n1 - i >= 4 ? 4 : n1 - i >= 2 ? 2 : 1;
            if (R == 4) rows_i8f(w, k, 4, k, gs, groups, m->group, in, B, out);
            else if (R == 2) rows_i8f(w, k, 2, k, gs, groups, m->group, in, B, out);
            else rows_i8f(w, k, 1, k, gs, groups, m->group, in, B, out);
            for (int r = 0; r < R; r++, i++) {
                if (!m->group)
                    for (int b = 0; b < B; b++) out[r * MAX_ROWS + b] *= m->scale[i];
                store(m, i, out + r * MAX_ROWS, B, y, ldy, add);
            }
        }
        return;
    }
    /* MAT_I8A8, MAT_I4 with x rounded twice: the rows one at a time take the second rounding (vectors
       Input.second on) in a second pass over the row, just read; the 16-row kernels in the same pass */
    const int twice = prepares(m) == PREPARE_TWO;
    const Input missed = from(in, twice ? in->second : 0);
    float second[MAX_ROWS];
#if HAVE_VNNI
    if (m->lanes) {  /* MAT_I4 or MAT_I8A8: the whole 16-row groups (steps of rows start at multiples of 16) */
        for (; n0 % 16 == 0 && n0 + 16 <= n1 && n0 + 16 <= m->n; n0 += 16) {
            if (m->kind == MAT_I4) rows_i4_lanes(m, n0 / 16, shift, in, B, y, ldy, add);
            else rows_i8a8_lanes(m, n0 / 16, in, B, y, ldy, add);
        }
    }
#elif AVX2
    if (m->lanes) {  /* as above (lanes_avx2.h) */
        for (; n0 % 16 == 0 && n0 + 16 <= n1 && n0 + 16 <= m->n; n0 += 16) rows_lanes_avx2(m, n0 / 16, in, B, y, ldy, add);
    }
#endif
    for (int64_t i = n0; i < n1; i++) {
        switch (m->kind) {
#if I8_BF16
        case MAT_I8:  /* x in bfloat16 (the float32 rows returned above); scales per group: inside the row's sums;
                         one per row: after them */
            row_i8h((const int8_t *)m->w + i * k, k, m->group ? m->scale + i * groups : NULL, m->group, in, B, out);
            if (!m->group)
                for (int b = 0; b < B; b++) out[b] *= m->scale[i];
            break;
#endif
        case MAT_I8A8:
            row_i8a8((const int8_t *)m->w + i * k, k, m->group ? m->scale + i * groups : NULL, m->group, in, B, out);
            if (twice) {
                row_i8a8((const int8_t *)m->w + i * k, k, m->group ? m->scale + i * groups : NULL, m->group, &missed,
                         B, second);
                for (int b = 0; b < B; b++) out[b] += second[b];
            }
            if (!m->group)
                for (int b = 0; b < B; b++) out[b] *= m->scale[i];
            break;
        default:
            row_i4((const uint8_t *)m->w + i * (k / 2), m->s16 + i * groups, m->m16 + i * groups, k, shift, in, B,
                   out);
            if (twice) {
                row_i4((const uint8_t *)m->w + i * (k / 2), m->s16 + i * groups, m->m16 + i * groups, k, shift,
                       &missed, B, second);
                for (int b = 0; b < B; b++) out[b] += second[b];
            }
        }
        store(m, i, out, B, y, ldy, add);
    }
}

#define FOR_ROWS(B, call)                                                                                     \
    switch (B) {                                                                                              \
    case 1: { const int rows_ = 1; call; } break;                                                             \
    case 2: { const int rows_ = 2; call; } break;                                                             \
    case 3: { const int rows_ = 3; call; } break;                                                             \
    case 4: { const int rows_ = 4; call; } break;                                                             \
    case 5: { const int rows_ = 5; call; } break;                                                             \
    case 6: { const int rows_ = 6; call; } break;                                                             \
    case 7: { const int rows_ = 7; call; } break;                                                             \
    default: { const int rows_ = 8; call; } break;                                                            \
    }

/* product_rows with B a constant in each case (the loops over B unrolled, the accumulators in registers). */
static void product(const Mat *m, const Input *in, int B, float *y, int64_t ldy, int64_t n0, int64_t n1, int add) {
    FOR_ROWS(B, product_rows(m, in, rows_, y, ldy, n0, n1, add))
}
