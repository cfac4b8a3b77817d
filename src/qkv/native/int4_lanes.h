/* MAT_I4 rows sixteen at a time, one row to each lane of a vector, for products.h (after int4_rows.h): the layout
   llama.cpp's repacked Q4_0 kernels use. row_i4 multiplies one row by x, its lanes holding columns: each block of
   32 then costs a conversion, a scaling and an FMA for every row and vector (8 lanes of a block share one scale).
   Here a vector holds 4 levels of each of 16 rows (Mat.lanes), and VNNI multiplies it by 4 values of xq broadcast
   from memory, so 8 dot products give the 16 rows' integer sums of a block, which one conversion, one scaling and
   two FMAs (the scale term and the minimum term) add to the rows' float32 sums:

       y_r = sum_c ( s_rc d_c (q_rc . xq_c) + m_rc d_c sum(xq_c) )        (d_c sum(xq_c): Input.sums)

   About a third of row_i4's instructions per weight at batch 1, a half at batch 8. The same sums in the same
   order at every batch size and on any thread (a row takes this kernel when its 16 rows are whole, which n alone
   decides), in another order than row_i4's: the last bits differ from it, not from one call to the next.

   Mat.lanes, for rows 16 g .. 16 g + 15 and block c: 4 vectors of 64 bytes, vector v holding, for row r, bytes 4 r
   .. 4 r + 3 = levels of positions 8 v + t (low nibble) and 8 v + 4 + t (high nibble), t = 0..3, where the
   positions of a block are Input.swapped's order (its 16 even columns, then its 16 odd ones). Mat.lane_s and
   Mat.lane_m: the float16 scales and minimums, (n / 16, groups, 16). native_step.py packs them. */

#if HAVE_VNNI
INLINE void rows_i4_lanes(const Mat *m, int64_t g, int shift, const Input *in, int B, float *y, int64_t ldy,
                          int add) {
    const int64_t k = m->k, blocks = k / BLOCK, groups = k / m->group;
    const uint8_t *w = (const uint8_t *)m->lanes + g * blocks * 256;
    const uint16_t *s16 = m->lane_s + g * groups * 16, *m16 = m->lane_m + g * groups * 16;
    const __m512i nibble = _mm512_set1_epi8(15);
    const int slices = m->slices == 2 ? 2 : 1;
    __m512 acc[MAX_ROWS];
    for (int b = 0; b < B; b++) acc[b] = _mm512_setzero_ps();
    for (int64_t c = 0; c < blocks; c++) {
        __builtin_prefetch(w + c * 256 + PREFETCH_INT4, 0, 1);
        __builtin_prefetch(w + c * 256 + 64 + PREFETCH_INT4, 0, 1);
        __builtin_prefetch(w + c * 256 + 128 + PREFETCH_INT4, 0, 1);
        __builtin_prefetch(w + c * 256 + 192 + PREFETCH_INT4, 0, 1);
        __m512i levels[8];
        for (int v = 0; v < 4; v++) {
            const __m512i both = _mm512_loadu_si512((const void *)(w + c * 256 + v * 64));
            levels[2 * v] = _mm512_and_si512(both, nibble);
            levels[2 * v + 1] = _mm512_and_si512(_mm512_srli_epi16(both, 4), nibble);
        }
        const __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s16 + (c >> shift) * 16)));
        const __m512 mins = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(m16 + (c >> shift) * 16)));
        for (int b = 0; b < B; b++)
            for (int t = 0; t < slices; t++) {  /* x's rounding, then (Mat.slices 2) what it missed, rounded */
                const int64_t at = b + t * in->second;
                const int32_t *x = (const int32_t *)(in->swapped + at * in->stride + c * BLOCK);  /* 4 values each */
                /* two chains of sums: each dot product waits for its chain's last (4% faster at batch 8) */
                __m512i dots = _mm512_setzero_si512(), odd = _mm512_setzero_si512();
                for (int v = 0; v < 4; v++) {
                    dots = _mm512_dpbusd_epi32(dots, levels[2 * v], _mm512_set1_epi32(x[2 * v]));
                    odd = _mm512_dpbusd_epi32(odd, levels[2 * v + 1], _mm512_set1_epi32(x[2 * v + 1]));
                }
                dots = _mm512_add_epi32(dots, odd);
                const float d = in->scales[at * (in->stride / 64 * LANES) + (c / 2) * LANES + (c % 2) * (LANES / 2)];
                acc[b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots), _mm512_mul_ps(s, _mm512_set1_ps(d)), acc[b]);
                acc[b] = _mm512_fmadd_ps(mins, _mm512_set1_ps(in->sums[at * (in->stride / BLOCK) + c]), acc[b]);
            }
    }
    const __m512 bias = m->bias ? _mm512_loadu_ps(m->bias + g * 16) : _mm512_setzero_ps();
    for (int b = 0; b < B; b++) {
        float *dst = y + b * ldy + g * 16;
        const __m512 out = _mm512_add_ps(acc[b], bias);
        _mm512_storeu_ps(dst, add ? _mm512_add_ps(_mm512_loadu_ps(dst), out) : out);
    }
}
#endif
