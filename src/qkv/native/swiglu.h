/* SwiGLU's gate, h = silu(g) * u with silu(g) = g sigmoid(g), and its gradients, each in one pass over the rows
   (included by decode_step.c; its exponentials are vectors.h's exp_lanes; qkv.native.swiglu calls it for a
   training step's gated feed-forward). With s = sigmoid(g) = 1 / (1 + e^-g) and dh = dL/dh:

       dL/du = dh g s,    dL/dg = dh u s (1 + g (1 - s))

   (PyTorch's silu_backward is the same expression). PyTorch computes these in five passes, keeping silu(g) as a
   third tensor; here the forward reads g and u once and the backward reads g, u and dh once. Without AVX-512 the
   functions return 1 and the caller uses PyTorch. */

#if defined(__AVX512F__)
static inline __m512 sigmoid_lanes(__m512 g) {
    /* e^-g for any g: exp_lanes clamps below at -87 (g > 87: s = 1) and gives +inf above 88 (g < -88: s = 0) */
    const __m512 one = _mm512_set1_ps(1.0f);
    return _mm512_div_ps(one, _mm512_add_ps(one, exp_lanes(_mm512_sub_ps(_mm512_setzero_ps(), g))));
}

/* 2u for GELU's tanh form, u = sqrt(2/pi) (v + 0.044715 v^3): tanh(u) = 2 sigmoid(2u) - 1. */
static inline __m512 gelu_tanh_argument(__m512 v) {
    const __m512 v3 = _mm512_mul_ps(_mm512_mul_ps(v, v), v);
    return _mm512_mul_ps(_mm512_set1_ps(2.0f * 0.79788456080286536f),
                         _mm512_add_ps(v, _mm512_mul_ps(_mm512_set1_ps(0.044715f), v3)));
}

/* erf(x) = sign(x) (1 - t (a1 + t (a2 + ... + t a5)) e^-x^2), t = 1 / (1 + p |x|) (Abramowitz and Stegun 7.1.26). */
static inline __m512 erf_lanes(__m512 x) {
    const __m512 ax = _mm512_abs_ps(x);
    const __m512 t = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_fmadd_ps(_mm512_set1_ps(0.3275911f), ax,
                                                                          _mm512_set1_ps(1.0f)));
    __m512 p = _mm512_set1_ps(1.061405429f);
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-1.453152027f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.421413741f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-0.284496736f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.254829592f));
    const __m512 e = exp_lanes(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(ax, ax)));
    const __m512 y = _mm512_fnmadd_ps(_mm512_mul_ps(p, t), e, _mm512_set1_ps(1.0f));
    return _mm512_or_ps(y, _mm512_and_ps(x, _mm512_set1_ps(-0.0f)));  /* x's sign */
}
#endif

/* h[i] = silu(g[i]) u[i] for n contiguous floats. */
int qkv_swiglu(const float *g, const float *u, float *h, int64_t n, int32_t threads) {
#if defined(__AVX512F__)
    const int64_t vectors = n / LANES;
#pragma omp parallel for schedule(static) num_threads(threads < 1 ? 1 : threads)
    for (int64_t i = 0; i <= vectors; i++) {
        const int64_t at = i * LANES;
        const __mmask16 m = lanes_left(n - at);
        if (!m) continue;
        const __m512 gv = _mm512_maskz_loadu_ps(m, g + at), uv = _mm512_maskz_loadu_ps(m, u + at);
        _mm512_mask_storeu_ps(h + at, m, _mm512_mul_ps(_mm512_mul_ps(gv, sigmoid_lanes(gv)), uv));
    }
    return 0;
#else
    (void)g, (void)u, (void)h, (void)n, (void)threads;
    return 1;
#endif
}

/* dg[i] and du[i] from dh[i] (all n contiguous floats). */
int qkv_swiglu_backward(const float *g, const float *u, const float *dh, float *dg, float *du, int64_t n,
                        int32_t threads) {
#if defined(__AVX512F__)
    const int64_t vectors = n / LANES;
    const __m512 one = _mm512_set1_ps(1.0f);
#pragma omp parallel for schedule(static) num_threads(threads < 1 ? 1 : threads)
    for (int64_t i = 0; i <= vectors; i++) {
        const int64_t at = i * LANES;
        const __mmask16 m = lanes_left(n - at);
        if (!m) continue;
        const __m512 gv = _mm512_maskz_loadu_ps(m, g + at), uv = _mm512_maskz_loadu_ps(m, u + at);
        const __m512 dv = _mm512_maskz_loadu_ps(m, dh + at), s = sigmoid_lanes(gv);
        _mm512_mask_storeu_ps(du + at, m, _mm512_mul_ps(dv, _mm512_mul_ps(gv, s)));
        const __m512 slope = _mm512_mul_ps(s, _mm512_add_ps(one, _mm512_mul_ps(gv, _mm512_sub_ps(one, s))));
        _mm512_mask_storeu_ps(dg + at, m, _mm512_mul_ps(_mm512_mul_ps(dv, uv), slope));
    }
    return 0;
#else
    (void)g, (void)u, (void)dh, (void)dg, (void)du, (void)n, (void)threads;
    return 1;
#endif
}
