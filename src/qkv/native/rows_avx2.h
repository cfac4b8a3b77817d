/* The rows of products.h on CPUs with AVX2 and FMA but not AVX-512 (most laptops; AMD's Zen 3 and older, Intel's
   client chips): the same products over 8-float registers, of which there are 16, not 32.

   The generic rows (a 16-float vector, two registers here) keep R x B sums in registers: 3 x 8 of them at batch 8,
   48 registers, which AVX2 does not have, so the sums spilled to memory and a batch-8 step of SmolLM2-135M took
   5.9x a batch-1 step. Here each row and vector has one 8-float chain of sums, and two rows share each load of x
   up to batch 6, one beyond (ROWS_AVX2; on SmolLM2-135M at batch 1, two rows made 4-bit rows 1.3x and int8 ones
   1.1x faster than four, whose sums and widened weights spilled, and than one; float32 rows, which only stream
   memory at batch 1, go one at a time there: one stream of weights a thread, ahead in 5 of 6 pairs of runs, one
   even, medians 4% apart). The sums of a vector never depend on R or B: each chain adds its 8 columns at a time
   in column order, so several tokens of one text in one step get the numbers they would get one at a time.

   MAT_I8 widens 8 int8 weights to float per instruction pair (the generic path converted them one by one);
   MAT_I4F forms s q + m of 8 levels at a time from their nibbles, the numbers of the dequantized matrix; MAT_I8A8
   and MAT_I4 multiply x's int8 blocks with maddubs (unsigned bytes times signed ones, pairs summed into 16 bits,
   then into 32): for int8 weights the signs of x move onto the weights first (|xq| <= 127, so a pair's
   2 x 127 x 127 cannot saturate, as llama.cpp's AVX2 Q8 dot does); 4-bit levels (0..15) are unsigned already. */

#if AVX2

/* Rows of a matrix of `kind` taken together for B vectors (at most 2: the arrays below hold 2 rows). */
#define ROWS_AVX2(kind, B) ((kind) == MAT_F32 && (B) == 1 ? 1 : (B) <= 6 ? 2 : 1)

/* Where each of B vectors starts, x + b ld: fma_rows loads from each address on its own (as x + b ld, GCC stepped one
   register by ld from vector to vector, each load's address waiting on the one before). */
INLINE void vector_starts(const float *x, int64_t ld, int B, const float **xs) {
    for (int b = 0; b < B; b++) xs[b] = x + b * ld;
}

/* acc[r][b] += a[r] times the 8 numbers at xs[b] + j, for R rows and B vectors: each x loaded once for the R rows. */
INLINE void fma_rows(__m256 acc[2][MAX_ROWS], const __m256 *a, const int R, const float *const *xs, int64_t j, int B) {
    for (int b = 0; b < B; b++) {
        const __m256 xb = _mm256_loadu_ps(xs[b] + j);
        for (int r = 0; r < R; r++) acc[r][b] = _mm256_fmadd_ps(a[r], xb, acc[r][b]);
    }
}

/* R rows of float32 weights, `ldw` apart, times B vectors: out[r * MAX_ROWS + b]. */
INLINE void rows_float_avx2(const float *w, int64_t ldw, const int R, int64_t k, const Input *in, int B,
                            float *out) {
    const float *xs[MAX_ROWS];
    vector_starts(in->x, in->ldx, B, xs);
    __m256 acc[2][MAX_ROWS];
    for (int r = 0; r < R; r++)
        for (int b = 0; b < B; b++) acc[r][b] = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= k; j += 8) {
        __m256 a[2];
        for (int r = 0; r < R; r++) {
            if ((j & 15) == 0) __builtin_prefetch(w + r * ldw + j + PREFETCH_ROWS * k, 0, 1);
            a[r] = _mm256_loadu_ps(w + r * ldw + j);
        }
        fma_rows(acc, a, R, xs, j, B);
    }
    for (int r = 0; r < R; r++)
        for (int b = 0; b < B; b++) {
            float sum = hsum8(acc[r][b]);
            for (int64_t t = j; t < k; t++) sum += w[r * ldw + t] * in->x[b * in->ldx + t];
            out[r * MAX_ROWS + b] = sum;
        }
}

/* R rows of int8 weights times B float32 vectors; with gs (groups of `group` columns, a multiple of 32; gs_ld floats
   between the rows' scales) each 8 weights are scaled by their group's before the FMAs. */
INLINE void rows_i8f_avx2(const int8_t *w, int64_t ldw, const int R, int64_t k, const float *gs, int64_t gs_ld,
                          int64_t group, const Input *in, int B, float *out) {
    const float *xs[MAX_ROWS];
    vector_starts(in->x, in->ldx, B, xs);
    __m256 acc[2][MAX_ROWS];
    for (int r = 0; r < R; r++)
        for (int b = 0; b < B; b++) acc[r][b] = _mm256_setzero_ps();
    const int shift = group > 0 && (group & (group - 1)) == 0 ? __builtin_ctzll((unsigned long long)group) : -1;
    int64_t j = 0;
    for (; j + BLOCK <= k; j += BLOCK) {  /* 32 columns, one scale per row (group is a multiple of 32) */
        __m256 s[2];
        for (int r = 0; r < R; r++) {
            __builtin_prefetch(w + r * ldw + j + PREFETCH_INT8, 0, 1);
            s[r] = _mm256_set1_ps(gs ? gs[r * gs_ld + (shift >= 0 ? j >> shift : j / group)] : 1.0f);
        }
#pragma GCC unroll 4
        for (int part = 0; part < BLOCK; part += 8) {
            __m256 a[2];
            for (int r = 0; r < R; r++) {
                a[r] = load_i8x8(w + r * ldw + j + part);
                if (gs) a[r] = _mm256_mul_ps(a[r], s[r]);
            }
            fma_rows(acc, a, R, xs, j + part, B);
        }
    }
    for (; j + 8 <= k; j += 8) {  /* (no groups: k need not be a multiple of 32) */
        __m256 a[2];
        for (int r = 0; r < R; r++) a[r] = load_i8x8(w + r * ldw + j);
        fma_rows(acc, a, R, xs, j, B);
    }
    for (int r = 0; r < R; r++)
        for (int b = 0; b < B; b++) {
            float sum = hsum8(acc[r][b]);
            for (int64_t t = j; t < k; t++)
                sum += (float)w[r * ldw + t] * (gs ? gs[r * gs_ld + t / group] : 1.0f) * in->x[b * in->ldx + t];
            out[r * MAX_ROWS + b] = sum;
        }
}

/* 8 levels of a 4-bit row as floats: the low (high = 0) or high (high = 1) nibbles of the 8 bytes at p. */
static inline __m256 nibbles8(const uint8_t *p, int high) {
    __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    v = high ? _mm256_srli_epi32(v, 4) : _mm256_and_si256(v, _mm256_set1_epi32(15));
    return _mm256_cvtepi32_ps(v);
}

/* R rows of 4-bit weights (MAT_I4F: W = s q + m, x unrounded in Input.fswapped's order) times B vectors. Each
   block of 32 columns in four parts of 8: the low nibbles of bytes 0-7 and 8-15 (fswapped's first 16), then their
   high nibbles (its last 16). */
INLINE void rows_i4f_avx2(const uint8_t *w, const uint16_t *s16, const uint16_t *m16, int64_t k, int shift,
                          const int R, int64_t groups, const Input *in, int B, float *out) {
    const int64_t blocks = k / BLOCK;
    const float *xs[MAX_ROWS];
    vector_starts(in->fswapped, in->stride, B, xs);
    __m256 acc[2][MAX_ROWS];
    for (int r = 0; r < R; r++)
        for (int b = 0; b < B; b++) acc[r][b] = _mm256_setzero_ps();
    for (int64_t c = 0; c < blocks; c++) {
        float s[2], m[2];
        for (int r = 0; r < R; r++) {
            __builtin_prefetch(w + r * (k / 2) + c * 16 + PREFETCH_INT4, 0, 1);
            s[r] = half_to_float(s16[r * groups + (c >> shift)]), m[r] = half_to_float(m16[r * groups + (c >> shift)]);
        }
#pragma GCC unroll 4
        for (int part = 0; part < 4; part++) {  /* (bytes 0-7, low), (8-15, low), (0-7, high), (8-15, high) */
            __m256 a[2];
            for (int r = 0; r < R; r++)
                a[r] = _mm256_fmadd_ps(nibbles8(w + r * (k / 2) + c * 16 + (part & 1) * 8, part >> 1),
                                       _mm256_set1_ps(s[r]), _mm256_set1_ps(m[r]));
            fma_rows(acc, a, R, xs, c * BLOCK + part * 8, B);
        }
    }
    for (int r = 0; r < R; r++)
        for (int b = 0; b < B; b++) out[r * MAX_ROWS + b] = hsum8(acc[r][b]);
}

/* The 8 int32 sums of 4 byte products each: unsigned u times signed s (pairs can't saturate: see the top). */
static inline __m256i dot_u8s8(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

/* MAT_I8A8: a row w of int8 weights times B vectors rounded to int8 blocks (Input.offq, xq + 128), as row_i8a8. */
INLINE void row_i8a8_avx2(const int8_t *w, int64_t k, const float *gs, int64_t group, const Input *in, int B,
                          float *out) {
    __m256 acc[MAX_ROWS];
    for (int b = 0; b < B; b++) acc[b] = _mm256_setzero_ps();
    const int shift = group > 0 && (group & (group - 1)) == 0 ? __builtin_ctzll((unsigned long long)group) : -1;
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    for (int64_t c = 0; c < k / BLOCK; c++) {
        const int64_t j = c * BLOCK;
        __builtin_prefetch(w + j + PREFETCH_INT8, 0, 1);
        const __m256i wv = _mm256_loadu_si256((const __m256i *)(w + j));
        const __m256 s = _mm256_set1_ps(gs ? gs[shift >= 0 ? j >> shift : j / group] : 1.0f);
#define I8A8_VECTOR(scaled)                                                                                     \
        for (int b = 0; b < B; b++) {                                                                           \
            const __m256i x = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(in->offq + b * in->stride + j)), flip); \
            const __m256i dots = dot_u8s8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(wv, x));                    \
            const __m256 d = _mm256_loadu_ps(in->scales + b * (in->stride / 64 * LANES) + (c / 2) * LANES + (c % 2) * (LANES / 2)); \
            acc[b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots), scaled, acc[b]);  /* (d: the block's, 8 copies) */ \
        }
        if (gs) I8A8_VECTOR(_mm256_mul_ps(d, s)) else I8A8_VECTOR(d)
#undef I8A8_VECTOR
    }
    for (int b = 0; b < B; b++) out[b] = hsum8(acc[b]);
}

/* MAT_I4: a row of 4-bit levels times B vectors rounded to int8 blocks (Input.swapped: each block's columns in the
   order of the bytes' low nibbles, then their high ones), as row_i4; the minimums are added by row_i4. */
INLINE void row_i4_levels_avx2(const uint8_t *w, const uint16_t *s16, int64_t k, int shift, const Input *in, int B,
                               float *out) {
    __m256 acc[MAX_ROWS];
    for (int b = 0; b < B; b++) acc[b] = _mm256_setzero_ps();
    const __m128i nibble = _mm_set1_epi8(15);
    for (int64_t c = 0; c < k / BLOCK; c++) {
        __builtin_prefetch(w + c * 16 + PREFETCH_INT4, 0, 1);
        const __m128i bytes = _mm_loadu_si128((const __m128i *)(w + c * 16));
        const __m256i levels = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(bytes, 4), nibble),
                                                _mm_and_si128(bytes, nibble));
        const __m256 s = _mm256_set1_ps(half_to_float(s16[c >> shift]));
        for (int b = 0; b < B; b++) {
            const __m256i x = _mm256_loadu_si256((const __m256i *)(in->swapped + b * in->stride + c * BLOCK));
            const __m256 d = _mm256_loadu_ps(in->scales + b * (in->stride / 64 * LANES) + (c / 2) * LANES + (c % 2) * (LANES / 2));
            acc[b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_u8s8(levels, x)), _mm256_mul_ps(s, d), acc[b]);
        }
    }
    for (int b = 0; b < B; b++) out[b] = hsum8(acc[b]);
}

/* MAT_I4's minimums, + sum_c m_c d_c sum(xq_c) into out (B), with a minimum per block (shift 0): 8 blocks a
   register, each 8 minimums widened once for all B vectors (one float chain per block went at the adds' latency). */
INLINE int64_t row_i4_mins_avx2(const uint16_t *m16, int64_t blocks, const Input *in, int B, float *out) {
    __m256 low[MAX_ROWS];
    for (int b = 0; b < B; b++) low[b] = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 8 <= blocks; c += 8) {
        const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(m16 + c)));
        for (int b = 0; b < B; b++) low[b] = _mm256_fmadd_ps(m, _mm256_loadu_ps(in->sums + b * (in->stride / BLOCK) + c), low[b]);
    }
    for (int b = 0; b < B; b++) out[b] += hsum8(low[b]);
    return c;  /* the blocks done */
}

/* products.h's product_rows for the float32, int8 (x in float32) and 4-bit (MAT_I4F) rows: 1 if it took m, else 0. */
INLINE int product_rows_avx2(const Mat *m, const Input *in, int B, float *y, int64_t ldy, int64_t n0, int64_t n1,
                             int add, float *out) {
    const int64_t k = m->k, groups = m->group ? k / m->group : 0;
    const int shift = m->group ? __builtin_ctz((unsigned)(m->group / BLOCK)) : 0;
    if (m->kind == MAT_F32 || m->kind == MAT_I4F || (m->kind == MAT_I8 && !int8_rows_in_bf16(m))) {
        /* ROWS_AVX2 rows at a time (the sums in registers), then the last few one by one */
        for (int64_t i = n0; i < n1;) {
            const int R = n1 - i >= ROWS_AVX2(m->kind, B) ? ROWS_AVX2(m->kind, B) : 1;
            if (m->kind == MAT_F32) {
                const float *w = (const float *)m->w + i * k;
                if (R == 2) rows_float_avx2(w, k, 2, k, in, B, out);
                else rows_float_avx2(w, k, 1, k, in, B, out);
            } else if (m->kind == MAT_I4F) {
                const uint8_t *w = (const uint8_t *)m->w + i * (k / 2);
                const uint16_t *s16 = m->s16 + i * groups, *m16 = m->m16 + i * groups;
                if (R == 2) rows_i4f_avx2(w, s16, m16, k, shift, 2, groups, in, B, out);
                else rows_i4f_avx2(w, s16, m16, k, shift, 1, groups, in, B, out);
            } else {
                const int8_t *w = (const int8_t *)m->w + i * k;
                const float *gs = m->group ? m->scale + i * groups : NULL;
                if (R == 2) rows_i8f_avx2(w, k, 2, k, gs, groups, m->group, in, B, out);
                else rows_i8f_avx2(w, k, 1, k, gs, groups, m->group, in, B, out);
            }
            for (int r = 0; r < R; r++, i++) {
                if (m->kind == MAT_I8 && !m->group)
                    for (int b = 0; b < B; b++) out[r * MAX_ROWS + b] *= m->scale[i];
                store(m, i, out + r * MAX_ROWS, B, y, ldy, add);
            }
        }
        return 1;
    }
    return 0;
}

#endif
