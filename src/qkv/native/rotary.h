/* Rotary position embedding of a training step's queries or keys, and its gradient, each in one pass (included by
   decode_step.c with vectors.h, whose lanes_left it uses; qkv.native.rotary calls it). Each row x of d numbers, at
   position t, splits into halves x1, x2 (h = d / 2 each) that rotate by the position's angles:

       y1 = x1 c1 + x2 s1,   y2 = x2 c2 + x1 s2,    (c, s) = (cos, sin_signed) at t: s1 = -sin, s2 = sin

   A rotation's transpose is the rotation back, so the gradient is the same pass with the sines' roles swapped:

       dx1 = dy1 c1 + dy2 s2,   dx2 = dy2 c2 + dy1 s1

   PyTorch takes four operators each way (two products, a roll, a sum). Rows are addressed by strides over (batch,
   head, position) with contiguous numbers within a row, so the heads split from a projection are read and written in
   the projection's own layout. Without AVX-512 the function returns 1 and the caller uses PyTorch. */

/* out from x (backward = 0) or dx from dy (backward = 1); tables (T, d) with rows `table_stride` apart. */
int qkv_rotary(const float *x, const int64_t *x_strides, const float *cos, const float *sin_signed,
               int64_t table_stride, float *out, const int64_t *out_strides, int64_t batch, int64_t heads,
               int64_t length, int64_t d, int32_t backward, int32_t threads) {
#if defined(__AVX512F__)
    const int64_t half = d / 2, rows = batch * heads * length;
#pragma omp parallel for schedule(static) num_threads(threads < 1 ? 1 : threads)
    for (int64_t i = 0; i < rows; i++) {
        const int64_t b = i / (heads * length), n = i / length % heads, t = i % length;
        const float *xi = x + b * x_strides[0] + n * x_strides[1] + t * x_strides[2];
        float *oi = out + b * out_strides[0] + n * out_strides[1] + t * out_strides[2];
        const float *c = cos + t * table_stride, *s = sin_signed + t * table_stride;
        for (int64_t k = 0; k < half; k += LANES) {
            const __mmask16 m = lanes_left(half - k);
            const __m512 x1 = _mm512_maskz_loadu_ps(m, xi + k), x2 = _mm512_maskz_loadu_ps(m, xi + half + k);
            const __m512 c1 = _mm512_maskz_loadu_ps(m, c + k), c2 = _mm512_maskz_loadu_ps(m, c + half + k);
            const __m512 s1 = _mm512_maskz_loadu_ps(m, s + k), s2 = _mm512_maskz_loadu_ps(m, s + half + k);
            const __m512 across1 = backward ? s2 : s1, across2 = backward ? s1 : s2;
            _mm512_mask_storeu_ps(oi + k, m, _mm512_add_ps(_mm512_mul_ps(x1, c1), _mm512_mul_ps(x2, across1)));
            _mm512_mask_storeu_ps(oi + half + k, m, _mm512_add_ps(_mm512_mul_ps(x2, c2), _mm512_mul_ps(x1, across2)));
        }
    }
    return 0;
#else
    (void)x, (void)x_strides, (void)cos, (void)sin_signed, (void)table_stride, (void)out, (void)out_strides;
    (void)batch, (void)heads, (void)length, (void)d, (void)backward, (void)threads;
    return 1;
#endif
}
