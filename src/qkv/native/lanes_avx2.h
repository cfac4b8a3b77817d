/* int4_lanes.h's 16-row kernel on CPUs with AVX2 but not AVX-512 (after rows_avx2.h): the same Mat.lanes layout,
   each 64-byte vector taken as two halves of 8 rows (bytes 0-31: rows 0-7, bytes 32-63: rows 8-15), one row to
   each lane of an 8-float register. Without VNNI, a block's integer sums come from maddubs (unsigned levels times
   signed xq, pairs summed into 16 bits) whose 16-bit results add up before one madd widens them to 32 bits:
   8 vectors of a block give each lane (row) at most 8 x 2 x 15 x 127 = 30480 (|xq| <= 127: block_scale), within
   int16. Per block, vector and 8 rows: 8 maddubs, 7 adds, 1 madd, 1 conversion and 2 FMAs, where row_i4_levels_avx2
   spends a dot product, a conversion, a scaling and an FMA per row.

       y_r = sum_c ( s_rc d_c (q_rc . xq_c) + m_rc d_c sum(xq_c) )        (as int4_lanes.h)

   The integer sums are exact and the float32 steps are int4_lanes.h's, lane for lane, so a row gets the numbers
   it gets there, and the same at every batch size. The vectors go four at a time over a half's blocks (four
   chains of sums and the 8 level registers fit AVX2's 16; eight spilled). */

#if AVX2
/* Rows 8 h .. 8 h + 7 of the 16-row group g times vectors b0 .. b0 + nb - 1 (nb <= 4), x rounded `slices` times
   (Mat.slices): nb and slices constants where inlined, so that the sums stay in registers. */
INLINE void i4_lanes_half(const Mat *m, int64_t g, int h, int shift, const Input *in, int b0, const int nb,
                          const int slices, float *y, int64_t ldy, int add) {
    const int64_t k = m->k, blocks = k / BLOCK, groups = k / m->group;
    const uint8_t *w = (const uint8_t *)m->lanes + g * blocks * 256 + h * 32;
    const uint16_t *s16 = m->lane_s + g * groups * 16 + h * 8, *m16 = m->lane_m + g * groups * 16 + h * 8;
    const __m256i nibble = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    __m256 acc[4];
    for (int b = 0; b < nb; b++) acc[b] = _mm256_setzero_ps();
    for (int64_t c = 0; c < blocks; c++) {
        const uint8_t *wc = w + c * 256;
        __builtin_prefetch(wc + PREFETCH_INT4, 0, 1);
        __builtin_prefetch(wc + 128 + PREFETCH_INT4, 0, 1);
        __m256i levels[8];
        for (int v = 0; v < 4; v++) {
            const __m256i both = _mm256_loadu_si256((const __m256i *)(wc + v * 64));
            levels[2 * v] = _mm256_and_si256(both, nibble);
            levels[2 * v + 1] = _mm256_and_si256(_mm256_srli_epi16(both, 4), nibble);
        }
        const __m256 s = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s16 + (c >> shift) * 16)));
        const __m256 mins = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(m16 + (c >> shift) * 16)));
        for (int b = 0; b < nb; b++)
            for (int t = 0; t < slices; t++) {  /* x's rounding, then (Mat.slices 2) what it missed */
                const int64_t at = b0 + b + t * in->second;
                const int32_t *x = (const int32_t *)(in->swapped + at * in->stride + c * BLOCK);
                __m256i sums = _mm256_maddubs_epi16(levels[0], _mm256_set1_epi32(x[0]));
                for (int v = 1; v < 8; v++)
                    sums = _mm256_add_epi16(sums, _mm256_maddubs_epi16(levels[v], _mm256_set1_epi32(x[v])));
                const __m256i dots = _mm256_madd_epi16(sums, ones);
                const float d = in->scales[at * (in->stride / 64 * LANES) + (c / 2) * LANES + (c % 2) * (LANES / 2)];
                acc[b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots), _mm256_mul_ps(s, _mm256_set1_ps(d)), acc[b]);
                acc[b] = _mm256_fmadd_ps(mins, _mm256_set1_ps(in->sums[at * (in->stride / BLOCK) + c]), acc[b]);
            }
    }
    const __m256 bias = m->bias ? _mm256_loadu_ps(m->bias + g * 16 + h * 8) : _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        float *dst = y + (b0 + b) * ldy + g * 16 + h * 8;
        const __m256 out = _mm256_add_ps(acc[b], bias);
        _mm256_storeu_ps(dst, add ? _mm256_add_ps(_mm256_loadu_ps(dst), out) : out);
    }
}

/* The 16 rows of group g times B vectors: each half, four vectors at a time. */
INLINE void rows_i4_lanes_avx2(const Mat *m, int64_t g, int shift, const Input *in, int B, float *y, int64_t ldy,
                               int add) {
#define HALF(nb, slices) i4_lanes_half(m, g, h, shift, in, b0, nb, slices, y, ldy, add)
#define HALVES(slices)                                                                                          \
    for (int h = 0; h < 2; h++) {                                                                               \
        int b0 = 0;                                                                                             \
        for (; b0 + 4 <= B; b0 += 4) HALF(4, slices);                                                           \
        if (B - b0 == 3) HALF(3, slices);                                                                       \
        else if (B - b0 == 2) HALF(2, slices);                                                                  \
        else if (B - b0 == 1) HALF(1, slices);                                                                  \
    }
    if (m->slices == 2) HALVES(2) else HALVES(1)
#undef HALVES
#undef HALF
}
#endif
