/* int4_lanes.h's and int8_lanes.h's 16-row kernels on CPUs with AVX2 but not AVX-512 (after rows_avx2.h): the
   same Mat.lanes layouts, each 64-byte vector taken as two halves of 8 rows (bytes 0-31: rows 0-7, 32-63: rows
   8-15), one row to each lane of an 8-float register.

   Int4: without VNNI, a block's integer sums come from maddubs (unsigned levels times signed xq, pairs summed
   into 16 bits) whose 16-bit results add up before one madd widens them to 32 bits: 8 vectors of a block give
   each lane (row) at most 8 x 2 x 15 x 127 = 30480 (|xq| <= 127: block_scale), within int16. Per block, vector
   and 8 rows: 8 maddubs, 7 adds, 1 madd, 1 conversion and 2 FMAs, where row_i4_levels_avx2 spends a dot product,
   a conversion, a scaling and an FMA per row.

       y_r = sum_c ( s_rc d_c (q_rc . xq_c) + m_rc d_c sum(xq_c) )        (as int4_lanes.h)

   Int8 weights cannot take xq + 128 as VNNI does: a pair of unsigned 255 times signed -128 overflows maddubs' 16
   bits. Their magnitudes |q| (at most 128) go unsigned instead, the weights' signs onto xq (vpsignb), and each
   product pair (at most 2 x 128 x 127) widens to 32 bits before the next is added:

       q_r . xq = sum_j |q_rj| (sign(q_rj) xq_j)      (no -128 sum(q_r) to add back: Mat.lane_off is unused)

   The integer sums are exact and the float32 steps are int4_lanes.h's and int8_lanes.h's, lane for lane, so a
   row gets the numbers it gets there, the same at every batch size however the vectors are grouped: four at a
   time over one half's blocks (four chains of sums and a block's 8 registers of weights fit AVX2's 16; eight
   spilled), or, int8 at batch 1 and 2, both halves in one pass (two passes over a block's 8 lines of weights
   made a batch-1 step slower than row_i8a8_avx2's rows). */

#if AVX2
/* y's rows 16 g + 8 h .. 16 g + 8 h + 7 of one vector (y_b): acc times the rows' scales (1 where none) plus the
   bias, written or (add) added. */
INLINE void store_rows8(const Mat *m, int64_t g, int h, __m256 acc, __m256 rows, float *y_b, int add) {
    const int64_t r = g * 16 + h * 8;
    const __m256 out = _mm256_fmadd_ps(acc, rows, m->bias ? _mm256_loadu_ps(m->bias + r) : _mm256_setzero_ps());
    _mm256_storeu_ps(y_b + r, add ? _mm256_add_ps(_mm256_loadu_ps(y_b + r), out) : out);
}

/* Rows 8 h .. 8 h + 7 of the 16-row group g times vectors b0 .. b0 + nb - 1, x rounded `slices` times (Mat.slices;
   nb x slices <= 8, at most 4 keeping their sums in registers): nb and slices constants where inlined. Each 64 bytes of a
   block's weights are split into their two nibbles once and multiplied by every vector at once (a block's eight
   registers of levels held for all vectors left too few registers for the sums at prompt lengths). */
INLINE void i4_lanes_half(const Mat *m, int64_t g, int h, const Input *in, int b0, const int nb, const int slices,
                          float *y, int64_t ldy, int add) {
    const int64_t k = m->k, blocks = k / BLOCK, groups = k / m->group;
    const int shift = __builtin_ctz((unsigned)(m->group / BLOCK));  /* groups of 32 << shift */
    const uint8_t *w = (const uint8_t *)m->lanes + g * blocks * 256 + h * 32;
    const uint16_t *s16 = m->lane_s + g * groups * 16 + h * 8, *m16 = m->lane_m + g * groups * 16 + h * 8;
    const __m256i nibble = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    const int8_t *xs[8];  /* (b, t) = j / slices, j % slices: x's rounding t of vector b0 + b, its scales, its sums */
    const float *ds[8], *sums[8];
    for (int j = 0; j < nb * slices; j++) {
        const int64_t at = b0 + j / slices + (j % slices) * in->second;
        xs[j] = in->swapped + at * in->stride;
        ds[j] = in->scales + at * (in->stride / 64 * LANES);  /* block c's d at 8 c */
        sums[j] = in->sums + at * (in->stride / BLOCK);
    }
    __m256 acc[4];
    for (int b = 0; b < nb; b++) acc[b] = _mm256_setzero_ps();
    for (int64_t c = 0; c < blocks; c++) {
        const uint8_t *wc = w + c * 256;
        __builtin_prefetch(wc + PREFETCH_INT4, 0, 1);
        __builtin_prefetch(wc + 128 + PREFETCH_INT4, 0, 1);
        __m256i dots[8];  /* 16-bit sums of pairs, two to a row */
        for (int j = 0; j < nb * slices; j++) dots[j] = _mm256_setzero_si256();
        for (int v = 0; v < 4; v++) {  /* levels 2 v (low nibbles) and 2 v + 1 (high) */
            const __m256i both = _mm256_loadu_si256((const __m256i *)(wc + v * 64));
            const __m256i lo = _mm256_and_si256(both, nibble), hi = _mm256_and_si256(_mm256_srli_epi16(both, 4), nibble);
            for (int j = 0; j < nb * slices; j++) {
                const int32_t *x = (const int32_t *)(xs[j] + c * BLOCK);
                dots[j] = _mm256_add_epi16(dots[j], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(x[2 * v])));
                dots[j] = _mm256_add_epi16(dots[j], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(x[2 * v + 1])));
            }
        }
        const __m256 s = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s16 + (c >> shift) * 16)));
        const __m256 mins = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(m16 + (c >> shift) * 16)));
        for (int j = 0; j < nb * slices; j++) {  /* x's rounding, then (Mat.slices 2) what it missed */
            __m256 *chain = &acc[j / slices];
            const __m256 sums32 = _mm256_cvtepi32_ps(_mm256_madd_epi16(dots[j], ones));
            *chain = _mm256_fmadd_ps(sums32, _mm256_mul_ps(s, _mm256_set1_ps(ds[j][8 * c])), *chain);
            *chain = _mm256_fmadd_ps(mins, _mm256_set1_ps(sums[j][c]), *chain);
        }
    }
    for (int b = 0; b < nb; b++) store_rows8(m, g, h, acc[b], _mm256_set1_ps(1.0f), y + (b0 + b) * ldy, add);
}

/* int8_lanes.h's rows 8 h .. 8 h + 7 of group g times vectors b0 .. b0 + nb - 1, as i4_lanes_half: each 64 bytes
   of weights loaded once, their magnitudes taken once, for every vector at once. */
INLINE void i8a8_lanes_half(const Mat *m, int64_t g, int h, const Input *in, int b0, const int nb, const int slices,
                            float *y, int64_t ldy, int add) {
    const int64_t k = m->k, blocks = k / BLOCK, groups = m->group ? k / m->group : 1;
    const int8_t *w = (const int8_t *)m->lanes + g * blocks * 512 + h * 32;
    const float *gs = m->group ? m->lane_f + g * groups * 16 + h * 8 : NULL;
    const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    const uint8_t *xs[8];  /* (b, t) = j / slices, j % slices: xq + 128 of rounding t of vector b0 + b, its scales */
    const float *ds[8];
    for (int j = 0; j < nb * slices; j++) {
        const int64_t at = b0 + j / slices + (j % slices) * in->second;
        xs[j] = in->offq + at * in->stride;
        ds[j] = in->scales + at * (in->stride / 64 * LANES);  /* block c's d at 8 c */
    }
    __m256 acc[4];
    for (int b = 0; b < nb; b++) acc[b] = _mm256_setzero_ps();
    for (int64_t c = 0; c < blocks; c++) {
        const int8_t *wc = w + c * 512;
        __m256i dots[8];
        for (int j = 0; j < nb * slices; j++) dots[j] = _mm256_setzero_si256();
        for (int v = 0; v < 8; v++) {
            __builtin_prefetch(wc + v * 64 + PREFETCH_INT8, 0, 1);
            const __m256i q = _mm256_loadu_si256((const __m256i *)(wc + v * 64)), magnitude = _mm256_abs_epi8(q);
            for (int j = 0; j < nb * slices; j++) {
                const int32_t *x = (const int32_t *)(xs[j] + c * BLOCK);
                const __m256i xq = _mm256_xor_si256(_mm256_set1_epi32(x[v]), flip);
                const __m256i pairs = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(xq, q));
                dots[j] = _mm256_add_epi32(dots[j], _mm256_madd_epi16(pairs, ones));
            }
        }
        const __m256 s = gs ? _mm256_loadu_ps(gs + c * BLOCK / m->group * 16) : _mm256_set1_ps(1.0f);
        for (int j = 0; j < nb * slices; j++) {  /* x's rounding, then (Mat.slices 2) what it missed */
            const __m256 d = _mm256_set1_ps(ds[j][8 * c]);
            acc[j / slices] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots[j]), gs ? _mm256_mul_ps(s, d) : d, acc[j / slices]);
        }
    }
    const __m256 rows = m->group ? _mm256_set1_ps(1.0f) : _mm256_loadu_ps(m->scale + g * 16 + h * 8);
    for (int b = 0; b < nb; b++) store_rows8(m, g, h, acc[b], rows, y + (b0 + b) * ldy, add);
}

/* All 16 rows of group g times vectors b0 .. b0 + nb - 1 (nb <= 2) in one pass over the weights, each 64 bytes
   loaded once for both halves: at batch 1 and 2, where two passes over a block's 8 lines of weights cost more than
   the products. The same integer sums and float32 steps as i8a8_lanes_half. */
INLINE void i8a8_lanes_whole(const Mat *m, int64_t g, const Input *in, int b0, const int nb, const int slices,
                             float *y, int64_t ldy, int add) {
    const int64_t k = m->k, blocks = k / BLOCK, groups = m->group ? k / m->group : 1;
    const int8_t *w = (const int8_t *)m->lanes + g * blocks * 512;
    const float *gs = m->group ? m->lane_f + g * groups * 16 : NULL;
    const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    __m256 acc[2][4];  /* [half][vector b x slices] */
    for (int b = 0; b < nb * slices; b++) acc[0][b] = acc[1][b] = _mm256_setzero_ps();
    for (int64_t c = 0; c < blocks; c++) {
        const int8_t *wc = w + c * 512;
        __m256i dots[2][4];
        for (int b = 0; b < nb * slices; b++) dots[0][b] = dots[1][b] = _mm256_setzero_si256();
        for (int v = 0; v < 8; v++) {
            __builtin_prefetch(wc + v * 64 + PREFETCH_INT8, 0, 1);
            const __m256i w0 = _mm256_loadu_si256((const __m256i *)(wc + v * 64));
            const __m256i w1 = _mm256_loadu_si256((const __m256i *)(wc + v * 64 + 32));
            const __m256i m0 = _mm256_abs_epi8(w0), m1 = _mm256_abs_epi8(w1);
            for (int b = 0; b < nb * slices; b++) {  /* (b, t): vector b0 + b / slices, rounding b % slices */
                const int64_t at = b0 + b / slices + (b % slices) * in->second;
                const int32_t *x = (const int32_t *)(in->offq + at * in->stride + c * BLOCK);  /* xq + 128 */
                const __m256i xq = _mm256_xor_si256(_mm256_set1_epi32(x[v]), flip);
                const __m256i p0 = _mm256_maddubs_epi16(m0, _mm256_sign_epi8(xq, w0));
                const __m256i p1 = _mm256_maddubs_epi16(m1, _mm256_sign_epi8(xq, w1));
                dots[0][b] = _mm256_add_epi32(dots[0][b], _mm256_madd_epi16(p0, ones));
                dots[1][b] = _mm256_add_epi32(dots[1][b], _mm256_madd_epi16(p1, ones));
            }
        }
        for (int h = 0; h < 2; h++) {
            const __m256 s = gs ? _mm256_loadu_ps(gs + c * BLOCK / m->group * 16 + h * 8) : _mm256_set1_ps(1.0f);
            for (int b = 0; b < nb * slices; b++) {
                const int64_t at = b0 + b / slices + (b % slices) * in->second;
                const float d = in->scales[at * (in->stride / 64 * LANES) + (c / 2) * LANES + (c % 2) * (LANES / 2)];
                const __m256 scale = gs ? _mm256_mul_ps(s, _mm256_set1_ps(d)) : _mm256_set1_ps(d);
                /* a vector's two roundings: into one chain, the first's then the second's, as i8a8_lanes_half */
                __m256 *chain = &acc[h][b / slices * slices];
                *chain = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots[h][b]), scale, *chain);
            }
        }
    }
    for (int h = 0; h < 2; h++) {
        const __m256 rows = m->group ? _mm256_set1_ps(1.0f) : _mm256_loadu_ps(m->scale + g * 16 + h * 8);
        for (int b = 0; b < nb; b++) store_rows8(m, g, h, acc[h][b * slices], rows, y + (b0 + b) * ldy, add);
    }
}

/* Rows 8 h .. 8 h + 7 of group g times vectors b0 .. b0 + nb - 1, in the kernel of int4 (i4) or int8 weights. */
INLINE void lanes_half(const Mat *m, int64_t g, int h, const Input *in, const int i4, int b0, const int nb,
                       const int slices, float *y, int64_t ldy, int add) {
    if (i4) i4_lanes_half(m, g, h, in, b0, nb, slices, y, ldy, add);
    else i8a8_lanes_half(m, g, h, in, b0, nb, slices, y, ldy, add);
}

/* Each half of group g's rows times B vectors, `step` at a time: the vector count a constant in every call. */
INLINE void lanes_halves(const Mat *m, int64_t g, const Input *in, int B, const int i4, const int slices,
                         const int step, float *y, int64_t ldy, int add) {
    for (int h = 0; h < 2; h++) {
        int b0 = 0;
        for (; b0 + step <= B; b0 += step) lanes_half(m, g, h, in, i4, b0, step, slices, y, ldy, add);
        if (step > 3 && B - b0 == 3) lanes_half(m, g, h, in, i4, b0, 3, slices, y, ldy, add);
        else if (step > 2 && B - b0 == 2) lanes_half(m, g, h, in, i4, b0, 2, slices, y, ldy, add);
        else if (B - b0 == 1) lanes_half(m, g, h, in, i4, b0, 1, slices, y, ldy, add);
    }
}

/* The 16 rows of group g (MAT_I4 or MAT_I8A8) times B vectors: int8 at batch 1 and 2 in one pass over both
   halves, else each half four vectors at a time (x rounded twice: two, so that the sums of four roundings stay in
   registers); the same numbers either way. x's rounding count a constant. */
INLINE void rows_lanes_avx2(const Mat *m, int64_t g, const Input *in, int B, float *y, int64_t ldy, int add) {
    if (m->kind == MAT_I4) {
        if (m->slices == 2) lanes_halves(m, g, in, B, 1, 2, 2, y, ldy, add);
        else lanes_halves(m, g, in, B, 1, 1, 4, y, ldy, add);
    } else if (B <= 2) {
        if (m->slices == 2) i8a8_lanes_whole(m, g, in, 0, B, 2, y, ldy, add);
        else i8a8_lanes_whole(m, g, in, 0, B, 1, y, ldy, add);
    } else if (m->slices == 2) lanes_halves(m, g, in, B, 0, 2, 2, y, ldy, add);
    else lanes_halves(m, g, in, B, 0, 1, 4, y, ldy, add);
}
#endif
