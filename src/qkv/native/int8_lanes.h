/* MAT_I8A8 rows sixteen at a time, one row to each lane of a vector, for products.h (after int8_rows.h), as
   int4_lanes.h does for MAT_I4. row_i8a8 multiplies one row by x, its lanes holding columns: each 64 weights then
   cost a dot product, a conversion and an FMA for every row and vector, and a reduction per row. Here a vector
   holds 4 weights of each of 16 rows (Mat.lanes), and VNNI multiplies xq + 128 (Input.offq), 4 values broadcast,
   by it, so 8 dot products give the 16 rows' integer sums of a block, starting from -128 times the rows' sums of
   the block's weights (Mat.lane_off), and one conversion, one scaling and one FMA add them to the rows' float32
   sums:

       y_r = s_r sum_c d_c (q_rc . xq_c)      or, with scales per group,      y_r = sum_c s_rc d_c (q_rc . xq_c)

   The same sums in the same order at every batch size and on any thread (a row takes this kernel when its 16 rows
   are whole, which n alone decides); in another order than row_i8a8's, so the last bits differ from it.

   Mat.lanes, for rows 16 g .. 16 g + 15 and block c: 8 vectors of 64 bytes, vector v holding, for row r, bytes
   4 r .. 4 r + 3 = the weights of columns 32 c + 4 v .. 32 c + 4 v + 3. Mat.lane_off: int32 (n / 16, k / 32, 16);
   Mat.lane_f: the scales per group, (n / 16, k / group, 16), or NULL (one per row: Mat.scale). native_step.py
   packs them. */

#if HAVE_VNNI
INLINE void rows_i8a8_lanes(const Mat *m, int64_t g, const Input *in, int B, float *y, int64_t ldy, int add) {
    const int64_t k = m->k, blocks = k / BLOCK, groups = m->group ? k / m->group : 1;
    const int8_t *w = (const int8_t *)m->lanes + g * blocks * 512;
    const int32_t *start = m->lane_off + g * blocks * 16;
    const float *gs = m->group ? m->lane_f + g * groups * 16 : NULL;
    const int slices = m->slices == 2 ? 2 : 1;
    __m512 acc[MAX_ROWS];
    for (int b = 0; b < B; b++) acc[b] = _mm512_setzero_ps();
    for (int64_t c = 0; c < blocks; c++) {
        __m512i wv[8];
        for (int v = 0; v < 8; v++) {
            __builtin_prefetch(w + c * 512 + v * 64 + PREFETCH_INT8, 0, 1);
            wv[v] = _mm512_loadu_si512((const void *)(w + c * 512 + v * 64));
        }
        const __m512i offset = _mm512_loadu_si512((const void *)(start + c * 16));
        const __m512 s = gs ? _mm512_loadu_ps(gs + c * BLOCK / m->group * 16) : _mm512_set1_ps(1.0f);  /* any multiple of 32 */
        for (int b = 0; b < B; b++)
            for (int t = 0; t < slices; t++) {  /* x's rounding, then (Mat.slices 2) what it missed, rounded */
                const int64_t at = b + t * in->second;
                const int32_t *x = (const int32_t *)(in->offq + at * in->stride + c * BLOCK);  /* 4 values each */
                /* two chains of sums: each dot product waits for its chain's last (8% faster at batch 8) */
                __m512i dots = offset, odd = _mm512_setzero_si512();
                for (int v = 0; v < 8; v += 2) {
                    dots = _mm512_dpbusd_epi32(dots, _mm512_set1_epi32(x[v]), wv[v]);
                    odd = _mm512_dpbusd_epi32(odd, _mm512_set1_epi32(x[v + 1]), wv[v + 1]);
                }
                dots = _mm512_add_epi32(dots, odd);
                const float d = in->scales[at * (in->stride / 64 * LANES) + (c / 2) * LANES + (c % 2) * (LANES / 2)];
                const __m512 scale = gs ? _mm512_mul_ps(s, _mm512_set1_ps(d)) : _mm512_set1_ps(d);
                acc[b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots), scale, acc[b]);
            }
    }
    const __m512 rows = m->group ? _mm512_set1_ps(1.0f) : _mm512_loadu_ps(m->scale + g * 16);
    const __m512 bias = m->bias ? _mm512_loadu_ps(m->bias + g * 16) : _mm512_setzero_ps();
    for (int b = 0; b < B; b++) {
        float *dst = y + b * ldy + g * 16;
        const __m512 out = _mm512_fmadd_ps(acc[b], rows, bias);
        _mm512_storeu_ps(dst, add ? _mm512_add_ps(_mm512_loadu_ps(dst), out) : out);
    }
}
#endif
