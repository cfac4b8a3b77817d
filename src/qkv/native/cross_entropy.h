/* The cross-entropy of a chunk of logits and its gradient, in place, one row at a time (included by decode_step.c
   after swiglu.h; qkv.layers.linear_cross_entropy calls it through qkv.native.cross_entropy). For a row z of V logits
   with target t, counted (keep = 1) or not (keep = 0):

       loss = keep (logsumexp(z) - z[t]),    dL/dz = keep (softmax(z) - onehot(t))

   with logsumexp(z) = m + log sum_j e^(z_j - m), m = max z. A row of a large vocabulary (SmolLM2's 49,152 floats,
   192 KB) stays in the core's cache while it is read three times (its maximum, its exponentials and their sum, their
   scaling), so the chunk crosses memory about once each way, where PyTorch's seven operators cross it seven times.
   The exponentials are exp_lanes' (prompt_attention.h). Without AVX-512 the function returns 1 and the caller uses
   PyTorch. */

/* losses[i] for each row; with `gradient`, the row's dL/dz written over its logits. */
int qkv_cross_entropy(float *logits, const int64_t *targets, const uint8_t *keep, float *losses, int64_t rows,
                      int64_t vocabulary, int32_t gradient, int32_t threads) {
#if defined(__AVX512F__)
#pragma omp parallel for schedule(static) num_threads(threads < 1 ? 1 : threads)
    for (int64_t i = 0; i < rows; i++) {
        float *z = logits + i * vocabulary;
        __m512 top = _mm512_set1_ps(-INFINITY);
        for (int64_t c = 0; c < vocabulary; c += LANES) {
            const __mmask16 m = lanes_left(vocabulary - c);
            top = _mm512_max_ps(top, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), m, z + c));
        }
        const float most = _mm512_reduce_max_ps(top), picked = z[targets[i]];
        const __m512 shift = _mm512_set1_ps(most);
        __m512 sum = _mm512_setzero_ps();
        for (int64_t c = 0; c < vocabulary; c += LANES) {
            const __mmask16 m = lanes_left(vocabulary - c);
            const __m512 e = _mm512_maskz_mov_ps(m, exp_lanes(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, z + c), shift)));
            sum = _mm512_add_ps(sum, e);
            if (gradient) _mm512_mask_storeu_ps(z + c, m, e);
        }
        const float total = _mm512_reduce_add_ps(sum);
        losses[i] = keep[i] ? logf(total) + most - picked : 0.0f;
        if (!gradient) continue;
        const __m512 scale = _mm512_set1_ps(keep[i] ? 1.0f / total : 0.0f);
        for (int64_t c = 0; c < vocabulary; c += LANES) {
            const __mmask16 m = lanes_left(vocabulary - c);
            _mm512_mask_storeu_ps(z + c, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, z + c), scale));
        }
        if (keep[i]) z[targets[i]] -= 1.0f;
    }
    return 0;
#else
    (void)logits, (void)targets, (void)keep, (void)losses, (void)rows, (void)vocabulary, (void)gradient, (void)threads;
    return 1;
#endif
}
