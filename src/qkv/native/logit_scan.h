/* One read of a step's logits before a token is chosen (included by decode_step.c after swiglu.h, whose lanes_left it
   uses; qkv.native.logit_scan calls it from the decoding engine). Per row z of n logits:

       finite  = no z_j is NaN or +-inf              (softmax(z / T) is a distribution only then)
       argmax  = the first j with z_j = max_i z_i     (greedy decoding's token, torch.argmax's tie rule)

   The finiteness test sums z_j - z_j, which is 0 for every finite value and NaN for NaN or an infinity. Each of the
   16 lanes keeps its own maximum and the first column where it appeared (a later equal value does not replace it);
   the lanes holding the row's maximum then give up the smallest of their columns: the first maximum of the row.
   Rows go to the threads whole, so a row's answer does not depend on the others. */

/* 1 if any of the rows x (rows x n, contiguous) holds NaN or an infinity, else 0; argmax (rows) may be NULL. */
int qkv_scan_logits(const float *x, int64_t rows, int64_t n, int64_t *argmax, int32_t threads) {
    int bad = 0;
#pragma omp parallel for schedule(static) num_threads(threads < 1 || rows < 2 ? 1 : threads) reduction(| : bad)
    for (int64_t r = 0; r < rows; r++) {
        const float *z = x + r * n;
        float best = -INFINITY, junk = 0.0f;
        int64_t at = 0, j = 0;
#if defined(__AVX512F__)
        if (n >= LANES) {
            __m512 top = _mm512_loadu_ps(z), nan = _mm512_sub_ps(top, top);
            __m512i where = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
            __m512i column = where;
            const __m512i step = _mm512_set1_epi32(LANES);
            for (j = LANES; j + LANES <= n; j += LANES) {
                const __m512 v = _mm512_loadu_ps(z + j);
                column = _mm512_add_epi32(column, step);
                nan = _mm512_add_ps(nan, _mm512_sub_ps(v, v));
                const __mmask16 more = _mm512_cmp_ps_mask(v, top, _CMP_GT_OQ);
                top = _mm512_mask_mov_ps(top, more, v);
                where = _mm512_mask_mov_epi32(where, more, column);
            }
            junk = _mm512_reduce_add_ps(nan);
            best = _mm512_reduce_max_ps(top);
            const __mmask16 holders = _mm512_cmp_ps_mask(top, _mm512_set1_ps(best), _CMP_EQ_OQ);
            at = _mm512_mask_reduce_min_epi32(holders, where);  /* columns fit 32 bits: n < 2^31 (the caller) */
        }
#endif
        for (; j < n; j++) {  /* the tail past the last whole vector, or every column without AVX-512 */
            junk += z[j] - z[j];
            if (z[j] > best) {  /* strictly: an equal value later keeps the first */
                best = z[j];
                at = j;
            }
        }
        if (junk != junk) bad = 1;  /* NaN: some value was NaN or infinite */
        if (argmax) argmax[r] = at;
    }
    return bad;
}
