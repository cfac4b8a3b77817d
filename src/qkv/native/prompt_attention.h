/* Causal attention of a sequence's queries, all at once (included by decode_step.c; qkv.native.prompt_attention calls
   it where PyTorch's CPU kernel would: a prompt of float32 rows, or a training step's, whose gradients
   attention_backward.h computes from the log-sum-exp this pass leaves).

   Queries (batch, h, Tq, d) are the last Tq of Tk positions; keys and values (batch, h_kv, Tk, d), h_kv dividing h
   (grouped-query attention). Query i, at position p = Tk - Tq + i, attends to keys p - window < j <= p (window 0:
   every j <= p) with softmax(scale q k_j), and its output is the weighted sum of the values.

   Each task is one head's tile of up to 8 consecutive queries, and walks the keys in blocks of 32 keeping a running
   maximum m, sum l and output o per query (the online softmax of FlashAttention): for a block with scores s,

       m' = max(m, max_j s_j),   l = l e^(m - m') + sum_j e^(s_j - m'),   o = o e^(m - m') + sum_j e^(s_j - m') v_j,

   and finally o / l. The scores of a block are 8 x 32 sums of d products each: the keys are transposed first (d, Tk)
   per key/value head, so 32 keys' entries c lie in two vectors, each multiplied by a query's entry c. e^x is
   vectors.h's exp_lanes. Without AVX-512 the function returns 1 and the caller uses PyTorch. */

#if defined(__AVX512F__)
#define PA_ROWS 8   /* queries of a tile */
#define PA_KEYS 32  /* keys of a block: two vectors of scores per query */

/* The lanes of keys j0 .. j0 + 15 that the query at position p sees: first <= j <= p (p < tk: the keys exist). */
static inline __mmask16 seen(int64_t j0, int64_t p, int64_t first) {
    const __m512i j = _mm512_add_epi32(_mm512_set1_epi32((int)j0),
                                       _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0));
    return _mm512_cmp_epi32_mask(j, _mm512_set1_epi32((int)first), _MM_CMPINT_NLT) &
           _mm512_cmp_epi32_mask(j, _mm512_set1_epi32((int)p), _MM_CMPINT_LE);
}

/* Queries at positions p0 .. p0 + R - 1 of one head: q (R rows, stride qs), transposed keys kt (d, tkp), values v
   (rows of stride vs), outputs o (R rows, stride os), and where lse is not NULL each query's log-sum-exp of its
   scaled scores, m + log l (R floats: what the backward pass recomputes the weights from). The arithmetic is done for PA_ROWS queries whatever R is (the
   last query repeated), so that every loop over them has a fixed count and its sums stay in registers. */
static void attend_tile(const float *q, int64_t qs, const float *kt, int64_t tkp, const float *v, int64_t vs, float *o,
                        int64_t os, float *lse, int R, int64_t d, int64_t p0, int64_t window, float scale) {
    float m[PA_ROWS], l[PA_ROWS], acc[PA_ROWS][256] __attribute__((aligned(64))), w[PA_KEYS][PA_ROWS];
    int64_t first[PA_ROWS], p[PA_ROWS];
    const float *rows[PA_ROWS];
    for (int r = 0; r < PA_ROWS; r++) {
        const int at = r < R ? r : R - 1;
        rows[r] = q + at * qs, p[r] = p0 + at;
        first[r] = window > 0 && p[r] - window + 1 > 0 ? p[r] - window + 1 : 0;
        m[r] = -INFINITY, l[r] = 0.0f;
        memset(acc[r], 0, (size_t)d * sizeof(float));
    }
    const int64_t last = p[PA_ROWS - 1];
    for (int64_t j0 = first[0] / PA_KEYS * PA_KEYS; j0 <= last; j0 += PA_KEYS) {
        __m512 s[PA_ROWS][2];
        for (int r = 0; r < PA_ROWS; r++) s[r][0] = s[r][1] = _mm512_setzero_ps();
        for (int64_t c = 0; c < d; c++) {  /* scores: 8 queries x 32 keys */
            const __m512 k0 = _mm512_loadu_ps(kt + c * tkp + j0), k1 = _mm512_loadu_ps(kt + c * tkp + j0 + LANES);
            for (int r = 0; r < PA_ROWS; r++) {
                const __m512 x = _mm512_set1_ps(rows[r][c]);
                s[r][0] = _mm512_fmadd_ps(x, k0, s[r][0]);
                s[r][1] = _mm512_fmadd_ps(x, k1, s[r][1]);
            }
        }
        const int64_t keys = last + 1 - j0 < PA_KEYS ? last + 1 - j0 : PA_KEYS;
        const int whole = j0 >= first[PA_ROWS - 1] && j0 + PA_KEYS - 1 <= p[0];  /* every query sees every key */
        for (int r = 0; r < PA_ROWS; r++) {
            const __mmask16 a = whole ? 0xffff : seen(j0, p[r], first[r]);
            const __mmask16 b = whole ? 0xffff : seen(j0 + LANES, p[r], first[r]);
            const __m512 x0 = _mm512_mul_ps(s[r][0], _mm512_set1_ps(scale));
            const __m512 x1 = _mm512_mul_ps(s[r][1], _mm512_set1_ps(scale));
            const __m512 none = _mm512_set1_ps(-INFINITY);
            const float top = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_mask_mov_ps(none, a, x0),
                                                                 _mm512_mask_mov_ps(none, b, x1)));
            float e[PA_KEYS];
            if (top == -INFINITY) {  /* none of this block's keys is seen by this query */
                memset(e, 0, sizeof e);
            } else {
                const float next = top > m[r] ? top : m[r], shrink = expf(m[r] - next);
                const __m512 e0 = _mm512_maskz_mov_ps(a, exp_lanes(_mm512_sub_ps(x0, _mm512_set1_ps(next))));
                const __m512 e1 = _mm512_maskz_mov_ps(b, exp_lanes(_mm512_sub_ps(x1, _mm512_set1_ps(next))));
                l[r] = l[r] * shrink + _mm512_reduce_add_ps(_mm512_add_ps(e0, e1));
                _mm512_storeu_ps(e, e0), _mm512_storeu_ps(e + LANES, e1);
                if (shrink != 1.0f)
                    for (int64_t c = 0; c < d; c += LANES)
                        _mm512_store_ps(acc[r] + c, _mm512_mul_ps(_mm512_load_ps(acc[r] + c), _mm512_set1_ps(shrink)));
                m[r] = next;
            }
            for (int j = 0; j < PA_KEYS; j++) w[j][r] = e[j];
        }
        for (int64_t c = 0; c < d; c += LANES) {  /* o += w V, 16 columns of the 8 queries at a time */
            __m512 sum[PA_ROWS];
            for (int r = 0; r < PA_ROWS; r++) sum[r] = _mm512_load_ps(acc[r] + c);
            for (int64_t j = 0; j < keys; j++) {
                const __m512 vj = _mm512_loadu_ps(v + (j0 + j) * vs + c);
                for (int r = 0; r < PA_ROWS; r++) sum[r] = _mm512_fmadd_ps(_mm512_set1_ps(w[j][r]), vj, sum[r]);
            }
            for (int r = 0; r < PA_ROWS; r++) _mm512_store_ps(acc[r] + c, sum[r]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int64_t c = 0; c < d; c++) o[r * os + c] = acc[r][c] / l[r];
    if (lse)
        for (int r = 0; r < R; r++) lse[r] = m[r] + logf(l[r]);
}
#endif

/* out (batch, h, Tq, d) = the attention above; each of q, k, v, out has its own strides (in floats) for batch, head
   and position, and d contiguous floats per position. d: a multiple of 16, at most 256. lse: NULL, or (batch, h, Tq)
   contiguous, each query's log-sum-exp (for attention_backward.h). Returns 1 where this build lacks AVX-512, or for
   another d, or without memory. */
int qkv_causal_attention(const float *q, const int64_t *q_strides, const float *k, const int64_t *k_strides,
                         const float *v, const int64_t *v_strides, float *out, const int64_t *out_strides, float *lse,
                         int64_t batch, int64_t heads, int64_t kv_heads, int64_t tq, int64_t tk, int64_t d,
                         int64_t window, float scale, int32_t threads) {
#if defined(__AVX512F__)
    if (d % LANES || d > 256 || heads % kv_heads || tq > tk) return 1;
    const int64_t tkp = (tk + PA_KEYS - 1) / PA_KEYS * PA_KEYS, group = heads / kv_heads;
    const int64_t tiles = (tq + PA_ROWS - 1) / PA_ROWS, tasks = batch * heads * tiles;
    float *kt = malloc((size_t)batch * kv_heads * d * tkp * sizeof(float));
    if (!kt) return 1;
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static) collapse(2)
        for (int64_t b = 0; b < batch; b++)
            for (int64_t g = 0; g < kv_heads; g++) {  /* keys transposed, zeros past tk */
                float *t = kt + (b * kv_heads + g) * d * tkp;
                const float *keys = k + b * k_strides[0] + g * k_strides[1];
                for (int64_t j = 0; j < tkp; j++)
                    for (int64_t c = 0; c < d; c++) t[c * tkp + j] = j < tk ? keys[j * k_strides[2] + c] : 0.0f;
            }
#pragma omp for schedule(dynamic)
        for (int64_t task = 0; task < tasks; task++) {  /* the last tiles (the most keys) first */
            const int64_t tile = tiles - 1 - task % tiles, h = task / tiles % heads, b = task / tiles / heads;
            const int64_t g = h / group, i0 = tile * PA_ROWS;
            const int R = tq - i0 < PA_ROWS ? (int)(tq - i0) : PA_ROWS;
            attend_tile(q + b * q_strides[0] + h * q_strides[1] + i0 * q_strides[2], q_strides[2],
                        kt + (b * kv_heads + g) * d * tkp, tkp, v + b * v_strides[0] + g * v_strides[1], v_strides[2],
                        out + b * out_strides[0] + h * out_strides[1] + i0 * out_strides[2], out_strides[2],
                        lse ? lse + (b * heads + h) * tq + i0 : NULL, R, d, tk - tq + i0, window, scale);
        }
    }
    free(kt);
    return 0;
#else
    (void)q, (void)q_strides, (void)k, (void)k_strides, (void)v, (void)v_strides, (void)out, (void)out_strides, (void)lse;
    (void)batch, (void)heads, (void)kv_heads, (void)tq, (void)tk, (void)d, (void)window, (void)scale, (void)threads;
    return 1;
#endif
}

/* Whether this build has the kernel (AVX-512): the tests' question. */
int qkv_prompt_attention_built(void) {
#if defined(__AVX512F__)
    return 1;
#else
    return 0;
#endif
}
