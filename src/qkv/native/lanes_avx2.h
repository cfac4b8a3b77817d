/* int4_lanes.h's and int8_lanes.h's 16-row kernels on CPUs with AVX2 but not AVX-512 (after rows_avx2.h): the
   same Mat.lanes layouts, each 64-byte vector taken as two halves of 8 rows (bytes 0-31: rows 0-7, 32-63: rows
   8-15), one row to each lane of an 8-float register. Each 32 bytes of weights are loaded once (int4: split into
   their two nibbles once) and multiplied by every vector of the call at once.

   x rounded once (int8 blocks xq on steps d). Int4: without VNNI, a block's integer sums come from maddubs
   (unsigned levels times signed xq, pairs summed into 16 bits) whose 16-bit results add up before one madd widens
   them to 32 bits: a block gives each lane (row) at most 8 x 2 x 15 x 127 = 30480 (|xq| <= 127: block_scale),
   within int16.

       y_r = sum_c ( s_rc d_c (q_rc . xq_c) + m_rc d_c sum(xq_c) )        (as int4_lanes.h)

   Int8 weights cannot take xq + 128 as VNNI does: a pair of unsigned 255 times signed -128 overflows maddubs' 16
   bits. Their magnitudes |q| (at most 128) go unsigned instead, the weights' signs onto xq (vpsignb), and each
   product pair (at most 2 x 128 x 127) widens to 32 bits before the next is added:

       q_r . xq = sum_j |q_rj| (sign(q_rj) xq_j)      (no -128 sum(q_r) to add back: Mat.lane_off is unused)

   x rounded twice (Mat.slices 2): its two int8 roundings are one 16-bit integer a value, x ~ d' xq16 with
   xq16 = FINER xq + xq' and d' = d / FINER (inputs.h, Input.x16), so the weights, widened to 16 bits once per 4
   columns of 8 rows, take one madd per vector (s16 x s16, pairs summed into 32 bits: at most 16 x 128 x 32385 a
   block) where two roundings took two maddubs, two madds and two sign flips:

       q_r . xq16 = FINER (q_r . xq) + q_r . xq'        (exact: the same integers as the two products)

   The integer sums are exact. With one rounding the float32 steps are int4_lanes.h's and int8_lanes.h's, lane for
   lane, so a row gets the numbers it gets there; with two, one scaling of the 16-bit sums (here) where VNNI's
   kernels scale each rounding's. On one CPU, the same numbers at every batch size however the vectors are grouped:
   four at a time over one half's blocks, or, int8 rounded once at batch 1 and 2, both halves in one pass (two
   passes over a block's 8 lines of weights made a batch-1 step slower than row_i8a8_avx2's rows). */

#if AVX2
/* y's rows 16 g + 8 h .. 16 g + 8 h + 7 of one vector (y_b): acc times the rows' scales (1 where none) plus the
   bias, written or (add) added. */
INLINE void store_rows8(const Mat *m, int64_t g, int h, __m256 acc, __m256 rows, float *y_b, int add) {
    const int64_t r = g * 16 + h * 8;
    const __m256 out = _mm256_fmadd_ps(acc, rows, m->bias ? _mm256_loadu_ps(m->bias + r) : _mm256_setzero_ps());
    _mm256_storeu_ps(y_b + r, add ? _mm256_add_ps(_mm256_loadu_ps(y_b + r), out) : out);
}

/* Where vector b's int8 blocks are in the forms the kernels read: its int8 levels (xq + 128 in column order, or
   xq in the 4-bit order), its steps (block c's d at 8 c), its sums d_c sum(xq_c). */
INLINE const void *levels_of(const Input *in, int64_t b, int i4) {
    return i4 ? (const void *)(in->swapped + b * in->stride) : (const void *)(in->offq + b * in->stride);
}
INLINE const float *steps_of(const Input *in, int64_t b) { return in->scales + b * (in->stride / 64 * LANES); }
INLINE const float *sums_of(const Input *in, int64_t b) { return in->sums + b * (in->stride / BLOCK); }

/* Rows 8 h .. 8 h + 7 of the 16-row group g times vectors b0 .. b0 + nb - 1 (nb <= 4, a constant where inlined),
   x rounded once. */
INLINE void i4_lanes_half(const Mat *m, int64_t g, int h, const Input *in, int b0, const int nb, float *y,
                          int64_t ldy, int add) {
    const int64_t k = m->k, blocks = k / BLOCK, groups = k / m->group;
    const int shift = __builtin_ctz((unsigned)(m->group / BLOCK));  /* groups of 32 << shift */
    const uint8_t *w = (const uint8_t *)m->lanes + g * blocks * 256 + h * 32;
    const uint16_t *s16 = m->lane_s + g * groups * 16 + h * 8, *m16 = m->lane_m + g * groups * 16 + h * 8;
    const __m256i nibble = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    const int8_t *xs[4];
    const float *ds[4], *sums[4];
    for (int b = 0; b < nb; b++)
        xs[b] = levels_of(in, b0 + b, 1), ds[b] = steps_of(in, b0 + b), sums[b] = sums_of(in, b0 + b);
    __m256 acc[4];
    for (int b = 0; b < nb; b++) acc[b] = _mm256_setzero_ps();
    for (int64_t c = 0; c < blocks; c++) {
        const uint8_t *wc = w + c * 256;
        __builtin_prefetch(wc + PREFETCH_INT4, 0, 1);
        __builtin_prefetch(wc + 128 + PREFETCH_INT4, 0, 1);
        __m256i dots[4];  /* 16-bit sums of pairs, two to a row */
        for (int b = 0; b < nb; b++) dots[b] = _mm256_setzero_si256();
        for (int v = 0; v < 4; v++) {  /* levels 2 v (low nibbles) and 2 v + 1 (high) */
            const __m256i both = _mm256_loadu_si256((const __m256i *)(wc + v * 64));
            const __m256i lo = _mm256_and_si256(both, nibble);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(both, 4), nibble);
            for (int b = 0; b < nb; b++) {
                const int32_t *x = (const int32_t *)(xs[b] + c * BLOCK);
                dots[b] = _mm256_add_epi16(dots[b], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(x[2 * v])));
                dots[b] = _mm256_add_epi16(dots[b], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(x[2 * v + 1])));
                __asm__("" : "+x"(dots[b]));  /* in a register: else GCC spilled the 8 maddubs and added later */
            }
        }
        const __m256 s = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s16 + (c >> shift) * 16)));
        const __m256 mins = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(m16 + (c >> shift) * 16)));
        for (int b = 0; b < nb; b++) {
            const __m256 sums32 = _mm256_cvtepi32_ps(_mm256_madd_epi16(dots[b], ones));
            acc[b] = _mm256_fmadd_ps(sums32, _mm256_mul_ps(s, _mm256_set1_ps(ds[b][8 * c])), acc[b]);
            acc[b] = _mm256_fmadd_ps(mins, _mm256_set1_ps(sums[b][c]), acc[b]);
        }
    }
    for (int b = 0; b < nb; b++) store_rows8(m, g, h, acc[b], _mm256_set1_ps(1.0f), y + (b0 + b) * ldy, add);
}

/* int8_lanes.h's rows 8 h .. 8 h + 7 of group g times vectors b0 .. b0 + nb - 1, as i4_lanes_half: each 64 bytes
   of weights loaded once, their magnitudes taken once, for every vector at once. */
INLINE void i8a8_lanes_half(const Mat *m, int64_t g, int h, const Input *in, int b0, const int nb, float *y,
                            int64_t ldy, int add) {
    const int64_t k = m->k, blocks = k / BLOCK, groups = m->group ? k / m->group : 1;
    const int8_t *w = (const int8_t *)m->lanes + g * blocks * 512 + h * 32;
    const float *gs = m->group ? m->lane_f + g * groups * 16 + h * 8 : NULL;
    const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    const uint8_t *xs[4];
    const float *ds[4];
    for (int b = 0; b < nb; b++) xs[b] = levels_of(in, b0 + b, 0), ds[b] = steps_of(in, b0 + b);
    __m256 acc[4];
    for (int b = 0; b < nb; b++) acc[b] = _mm256_setzero_ps();
    for (int64_t c = 0; c < blocks; c++) {
        const int8_t *wc = w + c * 512;
        __m256i dots[4];
        for (int b = 0; b < nb; b++) dots[b] = _mm256_setzero_si256();
        for (int v = 0; v < 8; v++) {
            __builtin_prefetch(wc + v * 64 + PREFETCH_INT8, 0, 1);
            const __m256i q = _mm256_loadu_si256((const __m256i *)(wc + v * 64)), magnitude = _mm256_abs_epi8(q);
            for (int b = 0; b < nb; b++) {
                const int32_t *x = (const int32_t *)(xs[b] + c * BLOCK);
                const __m256i xq = _mm256_xor_si256(_mm256_set1_epi32(x[v]), flip);
                const __m256i pairs = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(xq, q));
                dots[b] = _mm256_add_epi32(dots[b], _mm256_madd_epi16(pairs, ones));
            }
        }
        const __m256 s = gs ? _mm256_loadu_ps(gs + c * BLOCK / m->group * 16) : _mm256_set1_ps(1.0f);
        for (int b = 0; b < nb; b++) {
            const __m256 d = _mm256_set1_ps(ds[b][8 * c]);
            acc[b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots[b]), gs ? _mm256_mul_ps(s, d) : d, acc[b]);
        }
    }
    const __m256 rows = m->group ? _mm256_set1_ps(1.0f) : _mm256_loadu_ps(m->scale + g * 16 + h * 8);
    for (int b = 0; b < nb; b++) store_rows8(m, g, h, acc[b], rows, y + (b0 + b) * ldy, add);
}

/* All 16 rows of group g times vectors b0 .. b0 + nb - 1 (nb <= 2), x rounded once, in one pass over the weights,
   each 64 bytes loaded once for both halves: at batch 1 and 2, where two passes over a block's 8 lines of weights
   cost more than the products. The same integer sums and float32 steps as i8a8_lanes_half. */
INLINE void i8a8_lanes_whole(const Mat *m, int64_t g, const Input *in, int b0, const int nb, float *y, int64_t ldy,
                             int add) {
    const int64_t k = m->k, blocks = k / BLOCK, groups = m->group ? k / m->group : 1;
    const int8_t *w = (const int8_t *)m->lanes + g * blocks * 512;
    const float *gs = m->group ? m->lane_f + g * groups * 16 : NULL;
    const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    __m256 acc[2][2];  /* [half][vector] */
    for (int b = 0; b < nb; b++) acc[0][b] = acc[1][b] = _mm256_setzero_ps();
    for (int64_t c = 0; c < blocks; c++) {
        const int8_t *wc = w + c * 512;
        __m256i dots[2][2];
        for (int b = 0; b < nb; b++) dots[0][b] = dots[1][b] = _mm256_setzero_si256();
        for (int v = 0; v < 8; v++) {
            __builtin_prefetch(wc + v * 64 + PREFETCH_INT8, 0, 1);
            const __m256i w0 = _mm256_loadu_si256((const __m256i *)(wc + v * 64));
            const __m256i w1 = _mm256_loadu_si256((const __m256i *)(wc + v * 64 + 32));
            const __m256i m0 = _mm256_abs_epi8(w0), m1 = _mm256_abs_epi8(w1);
            for (int b = 0; b < nb; b++) {
                const int32_t *x = (const int32_t *)((const uint8_t *)levels_of(in, b0 + b, 0) + c * BLOCK);
                const __m256i xq = _mm256_xor_si256(_mm256_set1_epi32(x[v]), flip);
                const __m256i p0 = _mm256_maddubs_epi16(m0, _mm256_sign_epi8(xq, w0));
                const __m256i p1 = _mm256_maddubs_epi16(m1, _mm256_sign_epi8(xq, w1));
                dots[0][b] = _mm256_add_epi32(dots[0][b], _mm256_madd_epi16(p0, ones));
                dots[1][b] = _mm256_add_epi32(dots[1][b], _mm256_madd_epi16(p1, ones));
            }
        }
        for (int h = 0; h < 2; h++) {
            const __m256 s = gs ? _mm256_loadu_ps(gs + c * BLOCK / m->group * 16 + h * 8) : _mm256_set1_ps(1.0f);
            for (int b = 0; b < nb; b++) {
                const __m256 d = _mm256_set1_ps(steps_of(in, b0 + b)[8 * c]);
                acc[h][b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots[h][b]), gs ? _mm256_mul_ps(s, d) : d, acc[h][b]);
            }
        }
    }
    for (int h = 0; h < 2; h++) {
        const __m256 rows = m->group ? _mm256_set1_ps(1.0f) : _mm256_loadu_ps(m->scale + g * 16 + h * 8);
        for (int b = 0; b < nb; b++) store_rows8(m, g, h, acc[h][b], rows, y + (b0 + b) * ldy, add);
    }
}

/* dots[b] += the 8 rows' 4 levels q (32 bytes: int4 levels 0..15 or int8 weights, as Mat.lanes holds them) times the
   16-bit x at xs[b] + j .. j + 3, for each of nb vectors (lanes16_half). */
INLINE void lanes16_columns(__m256i q, const int i4, const int16_t *const *xs, int64_t j, const int nb,
                            __m256i dots[4][2]) {
    const __m128i q0 = _mm256_castsi256_si128(q), q1 = _mm256_extracti128_si256(q, 1);
    const __m256i w0 = i4 ? _mm256_cvtepu8_epi16(q0) : _mm256_cvtepi8_epi16(q0);  /* rows 0-3 */
    const __m256i w1 = i4 ? _mm256_cvtepu8_epi16(q1) : _mm256_cvtepi8_epi16(q1);  /* rows 4-7 */
    for (int b = 0; b < nb; b++) {
        int64_t four;  /* the 4 columns' 16-bit values */
        memcpy(&four, xs[b] + j, sizeof four);
        const __m256i x = _mm256_set1_epi64x(four);
        dots[b][0] = _mm256_add_epi32(dots[b][0], _mm256_madd_epi16(w0, x));
        dots[b][1] = _mm256_add_epi32(dots[b][1], _mm256_madd_epi16(w1, x));
        /* the sums here, in registers: GCC, free to reorder integer sums, otherwise computed all 8 x nb x 2 madds
           first, spilled them to the stack, and added them up after */
        __asm__("" : "+x"(dots[b][0]), "+x"(dots[b][1]));
    }
}

/* Rows 8 h .. 8 h + 7 of group g times vectors b0 .. b0 + nb - 1 (nb <= 4), x rounded twice: int4 (i4) or int8
   weights widened to 16 bits times Input.x16 (the header). A 32-byte line of 8 rows x 4 columns widens into rows
   0-3 and rows 4-7; madd leaves two sums a row, which one hadd per block folds, its lanes in the rows' order
   0 1 4 5 2 3 6 7 (`order`, its own inverse): the scales are put in that order, and the sums back at the end. */
INLINE void lanes16_half(const Mat *m, int64_t g, int h, const Input *in, const int i4, int b0, const int nb,
                         float *y, int64_t ldy, int add) {
    const int64_t k = m->k, blocks = k / BLOCK, groups = m->group ? k / m->group : 1;
    const int shift = m->group ? __builtin_ctz((unsigned)(m->group / BLOCK)) : 0;  /* groups of 32 << shift */
    const uint8_t *w = (const uint8_t *)m->lanes + g * blocks * (i4 ? 256 : 512) + h * 32;
    const uint16_t *s16 = i4 ? m->lane_s + g * groups * 16 + h * 8 : NULL;
    const uint16_t *m16 = i4 ? m->lane_m + g * groups * 16 + h * 8 : NULL;
    const float *gs = !i4 && m->group ? m->lane_f + g * groups * 16 + h * 8 : NULL;
    const __m256i order = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7), nibble = _mm256_set1_epi8(15);
    const int16_t *xs[4];
    const float *ds[4], *sums[4], *missed[4];  /* d' = d / FINER of block c at 8 c; d sum(xq), d' sum(xq') */
    for (int b = 0; b < nb; b++) {
        xs[b] = (i4 ? in->x16s : in->x16) + (b0 + b) * in->stride;
        ds[b] = steps_of(in, b0 + b + in->second);
        sums[b] = sums_of(in, b0 + b), missed[b] = sums_of(in, b0 + b + in->second);
    }
    __m256 acc[4];
    for (int b = 0; b < nb; b++) acc[b] = _mm256_setzero_ps();
    for (int64_t c = 0; c < blocks; c++) {
        const uint8_t *wc = w + c * (i4 ? 256 : 512);
        __m256i dots[4][2];  /* 32-bit sums of pairs: rows 0-3 and rows 4-7, two to a row */
        for (int b = 0; b < nb; b++) dots[b][0] = dots[b][1] = _mm256_setzero_si256();
        if (i4) {  /* 64 bytes u: the levels of columns 4 (2 u) .. (low nibbles), then of 4 (2 u + 1) .. (high) */
            for (int u = 0; u < 4; u++) {
                const __m256i both = _mm256_loadu_si256((const __m256i *)(wc + u * 64));
                __builtin_prefetch(wc + u * 64 + PREFETCH_INT4, 0, 1);
                lanes16_columns(_mm256_and_si256(both, nibble), 1, xs, c * BLOCK + 8 * u, nb, dots);
                lanes16_columns(_mm256_and_si256(_mm256_srli_epi16(both, 4), nibble), 1, xs, c * BLOCK + 8 * u + 4, nb,
                                dots);
            }
        } else {
            for (int v = 0; v < 8; v++) {  /* columns 4 v .. 4 v + 3 */
                __builtin_prefetch(wc + v * 64 + PREFETCH_INT8, 0, 1);
                lanes16_columns(_mm256_loadu_si256((const __m256i *)(wc + v * 64)), 0, xs, c * BLOCK + 4 * v, nb, dots);
            }
        }
        __m256 s = _mm256_set1_ps(1.0f), mins = _mm256_setzero_ps();
        if (i4) {
            s = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s16 + (c >> shift) * 16)));
            mins = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(m16 + (c >> shift) * 16)));
            mins = _mm256_permutevar8x32_ps(mins, order);
        } else if (gs) s = _mm256_loadu_ps(gs + c * BLOCK / m->group * 16);
        s = _mm256_permutevar8x32_ps(s, order);
        for (int b = 0; b < nb; b++) {
            const __m256 sums32 = _mm256_cvtepi32_ps(_mm256_hadd_epi32(dots[b][0], dots[b][1]));
            acc[b] = _mm256_fmadd_ps(sums32, _mm256_mul_ps(s, _mm256_set1_ps(ds[b][8 * c])), acc[b]);
            if (i4) acc[b] = _mm256_fmadd_ps(mins, _mm256_set1_ps(sums[b][c] + missed[b][c]), acc[b]);
        }
    }
    const __m256 rows = i4 || m->group ? _mm256_set1_ps(1.0f) : _mm256_loadu_ps(m->scale + g * 16 + h * 8);
    for (int b = 0; b < nb; b++)
        store_rows8(m, g, h, _mm256_permutevar8x32_ps(acc[b], order), rows, y + (b0 + b) * ldy, add);
}

/* Rows 8 h .. 8 h + 7 of group g times vectors b0 .. b0 + nb - 1: x rounded twice (x16), or once in the kernel of
   int4 (i4) or int8 weights. */
INLINE void lanes_half(const Mat *m, int64_t g, int h, const Input *in, const int i4, const int x16, int b0,
                       const int nb, float *y, int64_t ldy, int add) {
    if (x16) lanes16_half(m, g, h, in, i4, b0, nb, y, ldy, add);
    else if (i4) i4_lanes_half(m, g, h, in, b0, nb, y, ldy, add);
    else i8a8_lanes_half(m, g, h, in, b0, nb, y, ldy, add);
}

/* Each half of group g's rows times B vectors, four at a time: the vector count a constant in every call. */
INLINE void lanes_halves(const Mat *m, int64_t g, const Input *in, int B, const int i4, const int x16, float *y,
                         int64_t ldy, int add) {
    for (int h = 0; h < 2; h++) {
        int b0 = 0;
        for (; b0 + 4 <= B; b0 += 4) lanes_half(m, g, h, in, i4, x16, b0, 4, y, ldy, add);
        if (B - b0 == 3) lanes_half(m, g, h, in, i4, x16, b0, 3, y, ldy, add);
        else if (B - b0 == 2) lanes_half(m, g, h, in, i4, x16, b0, 2, y, ldy, add);
        else if (B - b0 == 1) lanes_half(m, g, h, in, i4, x16, b0, 1, y, ldy, add);
    }
}

/* The 16 rows of group g (MAT_I4 or MAT_I8A8) times B vectors: int8 rounded once at batch 1 and 2 in one pass
   over both halves, else each half four vectors at a time; the same numbers either way. */
INLINE void rows_lanes_avx2(const Mat *m, int64_t g, const Input *in, int B, float *y, int64_t ldy, int add) {
    const int i4 = m->kind == MAT_I4;
    if (m->slices == 2) {
        if (i4) lanes_halves(m, g, in, B, 1, 1, y, ldy, add);
        else lanes_halves(m, g, in, B, 0, 1, y, ldy, add);
    } else if (i4) lanes_halves(m, g, in, B, 1, 0, y, ldy, add);
    else if (B == 1) i8a8_lanes_whole(m, g, in, 0, 1, y, ldy, add);
    else if (B == 2) i8a8_lanes_whole(m, g, in, 0, 2, y, ldy, add);
    else lanes_halves(m, g, in, B, 0, 0, y, ldy, add);
}
#endif
