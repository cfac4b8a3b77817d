/* The feed-forward's activation over rows, as the decode step (decode_step.c) applies it between its two halves:
   ReLU, GELU (erf or tanh form), SiLU or ReLU squared, alone or gating (act(W_g h) * (W_1 h)), the functions of
   qkv.layers.feedforward (qkv/decoding/native_step.py's ACTIVATIONS numbers them). */

enum { ACT_RELU = 0, ACT_GELU = 1, ACT_GELU_TANH = 2, ACT_SILU = 3, ACT_RELU2 = 4 };

/* f = act(f) (or act(g) * f, gated) over entries n0 .. n1-1 of B rows of width ff: one loop per function. With
   AVX-512, SiLU and both GELUs take 16 entries at a time: silu(v) = v sigmoid(v); GELU's tanh form is
   0.5 v (1 + tanh(u)) = v sigmoid(2u), u = sqrt(2/pi) (v + 0.044715 v^3); erf by Abramowitz and Stegun's 7.1.26
   (|error| < 1.5e-7). */
static void activate_rows(int act, const float *g, float *f, int B, int64_t ff, int64_t n0, int64_t n1) {
#if defined(__AVX512F__)
    if (act == ACT_SILU || act == ACT_GELU || act == ACT_GELU_TANH) {
        for (int b = 0; b < B; b++)
            for (int64_t i = b * ff + n0; i < b * ff + n1; i += LANES) {
                const __mmask16 m = lanes_left(b * ff + n1 - i);
                const __m512 v = _mm512_maskz_loadu_ps(m, g ? g + i : f + i);
                __m512 a;
                if (act == ACT_SILU) a = _mm512_mul_ps(v, sigmoid_lanes(v));
                else if (act == ACT_GELU_TANH) a = _mm512_mul_ps(v, sigmoid_lanes(gelu_tanh_argument(v)));
                else a = _mm512_mul_ps(_mm512_mul_ps(v, _mm512_set1_ps(0.5f)),
                                       _mm512_add_ps(_mm512_set1_ps(1.0f), erf_lanes(
                                           _mm512_mul_ps(v, _mm512_set1_ps(0.70710678118654752f)))));
                if (g) a = _mm512_mul_ps(a, _mm512_maskz_loadu_ps(m, f + i));
                _mm512_mask_storeu_ps(f + i, m, a);
            }
        return;
    }
#elif AVX2
    if (act == ACT_SILU) {  /* v sigmoid(v), 8 entries at a time (e^-v: exp8 clamps to [-87, 88]) */
        for (int b = 0; b < B; b++) {
            int64_t i = b * ff + n0;
            for (; i + 8 <= b * ff + n1; i += 8) {
                const __m256 v = _mm256_loadu_ps(g ? g + i : f + i), one = _mm256_set1_ps(1.0f);
                __m256 a = _mm256_div_ps(v, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), v))));
                if (g) a = _mm256_mul_ps(a, _mm256_loadu_ps(f + i));
                _mm256_storeu_ps(f + i, a);
            }
            for (; i < b * ff + n1; i++) {
                const float v = g ? g[i] : f[i];
                f[i] = v / (1.0f + expf(-v)) * (g ? f[i] : 1.0f);
            }
        }
        return;
    }
#endif
#define ACTIVATE(expression)                                                                                    \
    for (int b = 0; b < B; b++)                                                                               \
        for (int64_t i = b * ff + n0; i < b * ff + n1; i++) {                                                 \
            float v = g ? g[i] : f[i];                                                                        \
            f[i] = (expression) * (g ? f[i] : 1.0f);                                                          \
        }
    switch (act) {
    case ACT_RELU: ACTIVATE(v > 0.0f ? v : 0.0f) break;
    case ACT_GELU: ACTIVATE(0.5f * v * (1.0f + erff(v * 0.70710678118654752f))) break;
    case ACT_GELU_TANH: ACTIVATE(0.5f * v * (1.0f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v)))) break;
    case ACT_SILU: ACTIVATE(v / (1.0f + expf(-v))) break;
    default: ACTIVATE((v > 0.0f ? v : 0.0f) * (v > 0.0f ? v : 0.0f)) break;
    }
#undef ACTIVATE
}
