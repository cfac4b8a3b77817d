/* Attention of one new token per row over the cached keys and values (included by decode_step.c).

   Row b's key/value head g serves query heads g * group .. (g + 1) * group - 1 (grouped-query attention). Its
   new key (rotated by RoPE, pairs (i, i + d_k / 2) as Hugging Face and qkv rotate them) and value are written
   at the row's position p; each of its query heads (rotated too) attends to the keys p - window < j <= p
   (window 0: all j <= p) with softmax(q k_j / sqrt(d_k)), and the weighted sum of the values is its output. */

static void rotate(float *x, const float *cos, const float *sin, int d) {
    int half = d / 2;
    for (int i = 0; i < half; i++) {
        float a = x[i], b = x[i + half];
        x[i] = a * cos[i] - b * sin[i];
        x[i + half] = b * cos[i + half] + a * sin[i + half];
    }
}

/* softmax(q k_j / sqrt(d_k)) over keys first..last, for each of the `group` queries q (rows of `queries`): the
   weighted sum of the values into out (group, d_k). DK: d_k known when compiled (its loops unrolled), or 0. */
static inline __attribute__((always_inline)) void attend_heads(const int DK, int dk, int group, const float *queries,
                                                                const float *keys, const float *values, int64_t first,
                                                                int64_t last, float *scores, float *out) {
    const int d = DK ? DK : dk, vecs = DK ? DK / LANES : 0;
    const float scale = 1.0f / sqrtf((float)d);
    for (int h = 0; h < group; h++) {
        const float *q = queries + h * d;
        float *p = scores + h * (last + 1), top = -INFINITY, total = 0.0f;
        for (int64_t j = first; j <= last; j++) {
            const float *key = keys + j * d;
            float s;
            if (DK) {
#if AVX2  /* vf's two halves in two registers: the same sums, lane for lane, as hsum's tree over them */
                __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
                for (int c = 0; c < vecs; c++) {
                    lo = _mm256_fmadd_ps(_mm256_loadu_ps(q + c * LANES), _mm256_loadu_ps(key + c * LANES), lo);
                    const int at = c * LANES + 8;
                    hi = _mm256_fmadd_ps(_mm256_loadu_ps(q + at), _mm256_loadu_ps(key + at), hi);
                }
                s = hsum8(_mm256_add_ps(lo, hi));
#else
                vf acc = {0};
                for (int c = 0; c < vecs; c++) acc = fmadd(load_f(q + c * LANES), load_f(key + c * LANES), acc);
                s = hsum(acc);
#endif
            } else {
                s = 0.0f;
                for (int c = 0; c < d; c++) s += q[c] * key[c];
            }
            p[j] = s * scale;
            top = p[j] > top ? p[j] : top;
        }
#if defined(__AVX512F__)
        __m512 sums = _mm512_setzero_ps();
        for (int64_t j = first; j <= last; j += LANES) {
            const __mmask16 m = lanes_left(last + 1 - j);
            const __m512 e = exp_lanes(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, p + j), _mm512_set1_ps(top)));
            _mm512_mask_storeu_ps(p + j, m, e);
            sums = _mm512_add_ps(sums, _mm512_maskz_mov_ps(m, e));
        }
        total = _mm512_reduce_add_ps(sums);
#elif AVX2
        __m256 sums = _mm256_setzero_ps();
        int64_t j = first;
        for (; j + 8 <= last + 1; j += 8) {
            const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p + j), _mm256_set1_ps(top)));
            _mm256_storeu_ps(p + j, e);
            sums = _mm256_add_ps(sums, e);
        }
        total = hsum8(sums);
        for (; j <= last; j++) total += p[j] = expf(p[j] - top);
#else
        for (int64_t j = first; j <= last; j++) total += p[j] = expf(p[j] - top);
#endif
        float *o = out + h * d;
#if AVX2
        if (DK) {  /* the vf loop below with vf's halves in registers (it spilled them, through memcpy) */
            __m256 acc[DK ? DK / 8 : 1];
            for (int c = 0; c < 2 * vecs; c++) acc[c] = _mm256_setzero_ps();
            for (int64_t j = first; j <= last; j++) {
                const __m256 pj = _mm256_set1_ps(p[j]);
                for (int c = 0; c < 2 * vecs; c++)
                    acc[c] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(values + j * d + c * 8), acc[c]);
            }
            const __m256 sum = _mm256_set1_ps(total);
            for (int c = 0; c < 2 * vecs; c++) _mm256_storeu_ps(o + c * 8, _mm256_div_ps(acc[c], sum));
        }
#else
        if (DK) {
            vf acc[DK ? DK / LANES : 1];
            for (int c = 0; c < vecs; c++) acc[c] = (vf){0};
            for (int64_t j = first; j <= last; j++)
                for (int c = 0; c < vecs; c++) acc[c] = fmadd((vf){0} + p[j], load_f(values + j * d + c * LANES), acc[c]);
            for (int c = 0; c < vecs; c++) {
                vf r = acc[c] / total;
                memcpy(o + c * LANES, &r, sizeof r);
            }
        }
#endif
        else {
            for (int c = 0; c < d; c++) o[c] = 0.0f;
            for (int64_t j = first; j <= last; j++)
                for (int c = 0; c < d; c++) o[c] += p[j] * values[j * d + c];
            for (int c = 0; c < d; c++) o[c] /= total;
        }
    }
}

/* The shape of attention: widths and counts, RoPE's tables (NULL: none), the window (0: none). */
typedef struct {
    int d_model, n_kv_heads, group, head_dim, window;
    const float *cos, *sin;  /* (positions, d_k) */
} Heads;

/* Row b's key/value head g: its key (rotated) and value written at pos into the row's cache kv (2, h_kv, L, d_k).
   qkv: the row's [q, k, v]. */
static void write_kv(const Heads *a, const float *qkv, float *kv, int64_t L, int64_t pos, int g) {
    const int dk = a->head_dim;
    float *key = kv + ((int64_t)g * L + pos) * dk, *value = kv + (((int64_t)a->n_kv_heads + g) * L + pos) * dk;
    memcpy(key, qkv + a->d_model + (int64_t)g * dk, dk * sizeof(float));
    memcpy(value, qkv + a->d_model + (int64_t)(a->n_kv_heads + g) * dk, dk * sizeof(float));
    if (a->cos) rotate(key, a->cos + pos * dk, a->sin + pos * dk, dk);
}

/* Attention of row b's query heads of key/value head g (rotated) over its cached keys into att (the row's
   d_model outputs). */
static void attend(const Heads *a, const float *qkv, const float *kv, int64_t L, int64_t pos, int g, float *att,
                   float *scores, float *q) {
    const int dk = a->head_dim, group = a->group;
    const float *keys = kv + (int64_t)g * L * dk, *values = kv + ((int64_t)a->n_kv_heads + g) * L * dk;
    memcpy(q, qkv + (int64_t)g * group * dk, (size_t)group * dk * sizeof(float));
    if (a->cos)
        for (int h = 0; h < group; h++) rotate(q + h * dk, a->cos + pos * dk, a->sin + pos * dk, dk);
    int64_t first = a->window > 0 && pos - a->window + 1 > 0 ? pos - a->window + 1 : 0;
    float *out = att + (int64_t)g * group * dk;
    if (dk == 64)
        attend_heads(64, dk, group, q, keys, values, first, pos, scores, out);
    else if (dk == 128)
        attend_heads(128, dk, group, q, keys, values, first, pos, scores, out);
    else
        attend_heads(0, dk, group, q, keys, values, first, pos, scores, out);
}
