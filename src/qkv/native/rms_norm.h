/* RMSNorm and its gradients, each in one pass over the rows (included by decode_step.c with vectors.h, whose
   lanes_left it uses; qkv.native.rms_norm calls it for a training step's norms). Per row x of d numbers, with the
   gain g and r = 1 / sqrt(mean(x^2) + eps):

       y = (x r) g,    dL/dx = r (u - x r^2 mean(u x))  with u = dy g,    dL/dg = sum over rows of dy x r

   The forward pass also leaves r for each row, so the backward pass reads x, dy and r once and writes dL/dx, with no
   tensor kept in between. dL/dg is summed by each thread over its own rows into its own row of `parts` (threads x d),
   which the caller adds up: the result does not depend on how the rows were scheduled. Without AVX-512 the functions
   return 1 and the caller uses PyTorch. */

#if defined(__AVX512F__)
static inline float row_dot(const float *a, const float *b, int64_t d) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t c = 0; c < d; c += LANES) {
        const __mmask16 m = lanes_left(d - c);
        acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, a + c), _mm512_maskz_loadu_ps(m, b + c)));
    }
    return _mm512_reduce_add_ps(acc);
}

/* g's lanes at column c, or ones where there is no gain */
static inline __m512 gain_lanes(const float *g, int64_t c, __mmask16 m) {
    return g ? _mm512_maskz_loadu_ps(m, g + c) : _mm512_set1_ps(1.0f);
}
#endif

/* y and r for `rows` contiguous rows of d floats; g may be NULL (a gain of ones). */
int qkv_rms_norm(const float *x, const float *g, float *y, float *r, int64_t rows, int64_t d, float eps,
                 int32_t threads) {
#if defined(__AVX512F__)
#pragma omp parallel for schedule(static) num_threads(threads < 1 ? 1 : threads)
    for (int64_t i = 0; i < rows; i++) {
        const float *xi = x + i * d;
        const float ri = 1.0f / sqrtf(row_dot(xi, xi, d) / (float)d + eps);
        const __m512 rv = _mm512_set1_ps(ri);
        r[i] = ri;
        for (int64_t c = 0; c < d; c += LANES) {
            const __mmask16 m = lanes_left(d - c);
            const __m512 scaled = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, xi + c), rv);
            _mm512_mask_storeu_ps(y + i * d + c, m, _mm512_mul_ps(scaled, gain_lanes(g, c, m)));
        }
    }
    return 0;
#else
    (void)x, (void)g, (void)y, (void)r, (void)rows, (void)d, (void)eps, (void)threads;
    return 1;
#endif
}

/* dx (if not NULL) and each thread's sum of dy x r over its rows into parts[thread] (if not NULL, threads x d floats,
   zeroed by the caller); g may be NULL. */
int qkv_rms_norm_backward(const float *x, const float *g, const float *r, const float *dy, float *dx, float *parts,
                          int64_t rows, int64_t d, int32_t threads) {
#if defined(__AVX512F__)
    threads = threads < 1 ? 1 : threads;
#pragma omp parallel num_threads(threads)
    {
        float *part = parts ? parts + (int64_t)omp_get_thread_num() * d : NULL;
#pragma omp for schedule(static)
        for (int64_t i = 0; i < rows; i++) {
            const float *xi = x + i * d, *dyi = dy + i * d;
            const __m512 rv = _mm512_set1_ps(r[i]);
            if (dx) {
                __m512 acc = _mm512_setzero_ps();  /* sum of u x */
                for (int64_t c = 0; c < d; c += LANES) {
                    const __mmask16 m = lanes_left(d - c);
                    const __m512 u = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, dyi + c), gain_lanes(g, c, m));
                    acc = _mm512_add_ps(acc, _mm512_mul_ps(u, _mm512_maskz_loadu_ps(m, xi + c)));
                }
                const float ri = r[i];
                const __m512 k = _mm512_set1_ps(ri * ri * _mm512_reduce_add_ps(acc) / (float)d);
                for (int64_t c = 0; c < d; c += LANES) {
                    const __mmask16 m = lanes_left(d - c);
                    const __m512 u = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, dyi + c), gain_lanes(g, c, m));
                    const __m512 inner = _mm512_sub_ps(u, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, xi + c), k));
                    _mm512_mask_storeu_ps(dx + i * d + c, m, _mm512_mul_ps(rv, inner));
                }
            }
            if (part)
                for (int64_t c = 0; c < d; c += LANES) {
                    const __mmask16 m = lanes_left(d - c);
                    const __m512 term = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, dyi + c),
                                                      _mm512_mul_ps(_mm512_maskz_loadu_ps(m, xi + c), rv));
                    _mm512_mask_storeu_ps(part + c, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, part + c), term));
                }
        }
    }
    return 0;
#else
    (void)x, (void)g, (void)r, (void)dy, (void)dx, (void)parts, (void)rows, (void)d, (void)threads;
    return 1;
#endif
}
