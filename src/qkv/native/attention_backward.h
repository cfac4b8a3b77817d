/* The gradients of prompt_attention.h's causal attention (included by decode_step.c after it; called by
   qkv.native.prompt_attention's autograd function when a training step needs them).

   With the scaled scores x_ij = scale q_i k_j, the weights P_ij = e^(x_ij - lse_i) (lse_i the forward's log-sum-exp
   of row i, so no second softmax pass) and o_i = sum_j P_ij v_j, the gradients of a loss L given dO = dL/do are
   FlashAttention-2's:

       D_i = dO_i . o_i,    dP_ij = dO_i . v_j,    dS_ij = P_ij (dP_ij - D_i)
       dV_j = sum_i P_ij dO_i,    dK_j = scale sum_i dS_ij q_i,    dQ_i = scale sum_j dS_ij k_j

   the sums over the (i, j) pairs the forward pass let through (j <= p_i, and inside the window). One task is one
   batch row's key/value head with all the query heads that share it: it owns their dQ rows and its own dK and dV
   rows, so no two threads write the same number. It walks the keys in blocks of 32, and for each block every tile of
   8 queries that sees it, recomputing that tile's 8 x 32 scores: the block's dK and dV sums stay in a small buffer
   and each tile's dQ rows in the output. Without AVX-512 the function returns 1 and autograd's PyTorch path is
   used. */

#if defined(__AVX512F__)
/* dst[j][c] += sum_r w[r][j] row_r[c] for the 32 rows j of a block and 16 columns c at `at`: eight rows j at a time,
   so that eight independent sums are in flight (each w[r][j] is broadcast from memory); rows are 8 pointers. */
static inline void add_outer(float *dst, int64_t ds, const float (*w)[PA_KEYS], const float *const *rows, int64_t at) {
    __m512 x[PA_ROWS];
    for (int r = 0; r < PA_ROWS; r++) x[r] = _mm512_loadu_ps(rows[r] + at);
    for (int j = 0; j < PA_KEYS; j += 8) {
        __m512 acc[8];
        for (int u = 0; u < 8; u++) acc[u] = _mm512_loadu_ps(dst + (j + u) * ds + at);
        for (int r = 0; r < PA_ROWS; r++)
            for (int u = 0; u < 8; u++) acc[u] = _mm512_fmadd_ps(_mm512_set1_ps(w[r][j + u]), x[r], acc[u]);
        for (int u = 0; u < 8; u++) _mm512_storeu_ps(dst + (j + u) * ds + at, acc[u]);
    }
}

/* 8 rows' dot products with 32 keys: t[r][0..1] = sum_c a_r[c] kt[c][j0 .. j0 + 31] (kt: transposed, row tkp). */
static inline void dots(__m512 t[PA_ROWS][2], const float *const *a, const float *kt, int64_t tkp, int64_t j0, int64_t d) {
    for (int r = 0; r < PA_ROWS; r++) t[r][0] = t[r][1] = _mm512_setzero_ps();
    for (int64_t c = 0; c < d; c++) {
        const __m512 k0 = _mm512_loadu_ps(kt + c * tkp + j0), k1 = _mm512_loadu_ps(kt + c * tkp + j0 + LANES);
        for (int r = 0; r < PA_ROWS; r++) {
            const __m512 x = _mm512_set1_ps(a[r][c]);
            t[r][0] = _mm512_fmadd_ps(x, k0, t[r][0]);
            t[r][1] = _mm512_fmadd_ps(x, k1, t[r][1]);
        }
    }
}

typedef struct {                 /* one task's tensors: a batch row b, a key/value head g and its group of heads */
    const float *q, *o, *dout;   /* head g * group's rows; heads hs floats apart, rows rs apart */
    int64_t q_hs, q_rs, o_hs, o_rs, do_hs, do_rs;
    const float *k, *v;          /* rows ks / vs apart */
    int64_t ks, vs;
    const float *lse;            /* (group, tq) */
    float *dq, *dk, *dv;         /* dq like q's heads (dq_hs, dq_rs); dk, dv rows dk_rs / dv_rs apart */
    int64_t dq_hs, dq_rs, dk_rs, dv_rs;
} GradTask;

/* One task: scratch holds kt, vt (d, tkp), kr (tkp, d), the block's dK and dV (32, d), D (group, tq), and a row of
   d zeros that stands in for the missing queries of a short tile. */
static void attention_grad_task(const GradTask *t, float *scratch, int64_t group, int64_t tq, int64_t tk, int64_t d,
                                int64_t window, float scale) {
    const int64_t tkp = (tk + PA_KEYS - 1) / PA_KEYS * PA_KEYS, shift = tk - tq;
    float *kt = scratch, *vt = kt + d * tkp, *kr = vt + d * tkp, *dkb = kr + tkp * d, *dvb = dkb + PA_KEYS * d;
    float *D = dvb + PA_KEYS * d, *zeros = D + group * tq, *sink = zeros + d;
    for (int64_t j = 0; j < tkp; j++)
        for (int64_t c = 0; c < d; c++) {
            const float kv = j < tk ? t->k[j * t->ks + c] : 0.0f, vv = j < tk ? t->v[j * t->vs + c] : 0.0f;
            kt[c * tkp + j] = kv, vt[c * tkp + j] = vv, kr[j * d + c] = kv;
        }
    memset(zeros, 0, (size_t)d * sizeof(float));
    for (int64_t h = 0; h < group; h++)
        for (int64_t i = 0; i < tq; i++) {
            const float *o = t->o + h * t->o_hs + i * t->o_rs, *g = t->dout + h * t->do_hs + i * t->do_rs;
            float sum = 0.0f;
            for (int64_t c = 0; c < d; c++) sum += o[c] * g[c];
            D[h * tq + i] = sum;
            memset(t->dq + h * t->dq_hs + i * t->dq_rs, 0, (size_t)d * sizeof(float));
        }
    for (int64_t j0 = 0; j0 < tk; j0 += PA_KEYS) {
        memset(dkb, 0, (size_t)2 * PA_KEYS * d * sizeof(float));
        const int64_t keys = tk - j0 < PA_KEYS ? tk - j0 : PA_KEYS;
        /* queries that see a key of this block: p_i >= j0, and p_i - window + 1 <= j0 + keys - 1 */
        int64_t lo = j0 - shift > 0 ? j0 - shift : 0, hi = tq;
        if (window > 0 && j0 + keys - 1 + window - shift < hi) hi = j0 + keys - 1 + window - shift;
        for (int64_t h = 0; h < group; h++)
            for (int64_t i0 = lo / PA_ROWS * PA_ROWS; i0 < hi; i0 += PA_ROWS) {
                const float *qr[PA_ROWS], *gr[PA_ROWS];
                float *dqr[PA_ROWS];
                float pw[PA_ROWS][PA_KEYS] __attribute__((aligned(64))), sw[PA_ROWS][PA_KEYS] __attribute__((aligned(64)));
                int64_t p[PA_ROWS], first[PA_ROWS];
                for (int r = 0; r < PA_ROWS; r++) {
                    const int64_t i = i0 + r;
                    const int real = i < tq;
                    qr[r] = real ? t->q + h * t->q_hs + i * t->q_rs : zeros;
                    gr[r] = real ? t->dout + h * t->do_hs + i * t->do_rs : zeros;
                    dqr[r] = real ? t->dq + h * t->dq_hs + i * t->dq_rs : sink;
                    p[r] = shift + i;
                    first[r] = window > 0 && p[r] - window + 1 > 0 ? p[r] - window + 1 : 0;
                }
                __m512 s[PA_ROWS][2], dp[PA_ROWS][2];
                dots(s, qr, kt, tkp, j0, d);
                dots(dp, gr, vt, tkp, j0, d);
                for (int r = 0; r < PA_ROWS; r++) {
                    const int real = i0 + r < tq;
                    const __mmask16 a = real ? seen(j0, p[r], first[r]) : 0;
                    const __mmask16 b = real ? seen(j0 + LANES, p[r], first[r]) : 0;
                    const __m512 lse = _mm512_set1_ps(real ? t->lse[h * tq + i0 + r] : 0.0f);
                    const __m512 Dr = _mm512_set1_ps(real ? D[h * tq + i0 + r] : 0.0f), sc = _mm512_set1_ps(scale);
                    const __m512 p0 = _mm512_maskz_mov_ps(a, exp_lanes(_mm512_fmsub_ps(s[r][0], sc, lse)));
                    const __m512 p1 = _mm512_maskz_mov_ps(b, exp_lanes(_mm512_fmsub_ps(s[r][1], sc, lse)));
                    const __m512 d0 = _mm512_mul_ps(_mm512_mul_ps(p0, _mm512_sub_ps(dp[r][0], Dr)), sc);
                    const __m512 d1 = _mm512_mul_ps(_mm512_mul_ps(p1, _mm512_sub_ps(dp[r][1], Dr)), sc);
                    _mm512_store_ps(pw[r], p0), _mm512_store_ps(pw[r] + LANES, p1);
                    _mm512_store_ps(sw[r], d0), _mm512_store_ps(sw[r] + LANES, d1);
                }
                for (int64_t c = 0; c < d; c += LANES) {
                    add_outer(dvb, d, pw, gr, c);  /* dV_j += P_ij dO_i */
                    add_outer(dkb, d, sw, qr, c);  /* dK_j += scale dS_ij q_i */
                    __m512 acc[PA_ROWS];           /* dQ_i += scale dS_ij k_j */
                    for (int r = 0; r < PA_ROWS; r++) acc[r] = _mm512_loadu_ps(dqr[r] + c);
                    for (int j = 0; j < PA_KEYS; j++) {
                        const __m512 kj = _mm512_loadu_ps(kr + (j0 + j) * d + c);
                        for (int r = 0; r < PA_ROWS; r++) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(sw[r][j]), kj, acc[r]);
                    }
                    for (int r = 0; r < PA_ROWS; r++) _mm512_storeu_ps(dqr[r] + c, acc[r]);
                }
            }
        for (int64_t j = 0; j < keys; j++) {
            memcpy(t->dk + (j0 + j) * t->dk_rs, dkb + j * d, (size_t)d * sizeof(float));
            memcpy(t->dv + (j0 + j) * t->dv_rs, dvb + j * d, (size_t)d * sizeof(float));
        }
    }
}
#endif

/* dq (batch, h, Tq, d), dk and dv (batch, h_kv, Tk, d) of the attention qkv_causal_attention computed, from its q,
   k, v, out and lse and the gradient dout of its output. Strides as there (batch, head, position; d contiguous);
   lse contiguous (batch, h, Tq). Every entry of dq, dk and dv is written. Returns 1 where this build lacks AVX-512,
   for another d, or without memory. */
int qkv_causal_attention_backward(const float *q, const int64_t *q_strides, const float *k, const int64_t *k_strides,
                                  const float *v, const int64_t *v_strides, const float *out,
                                  const int64_t *out_strides, const float *dout, const int64_t *dout_strides,
                                  const float *lse, float *dq, const int64_t *dq_strides, float *dk,
                                  const int64_t *dk_strides, float *dv, const int64_t *dv_strides, int64_t batch,
                                  int64_t heads, int64_t kv_heads, int64_t tq, int64_t tk, int64_t d, int64_t window,
                                  float scale, int32_t threads) {
#if defined(__AVX512F__)
    if (d % LANES || d > 256 || heads % kv_heads || tq > tk) return 1;
    const int64_t group = heads / kv_heads, tkp = (tk + PA_KEYS - 1) / PA_KEYS * PA_KEYS;
    const int64_t per_task = 3 * d * tkp + 2 * PA_KEYS * d + group * tq + 2 * d;
    const int64_t tasks = batch * kv_heads;
    const int workers = threads < 1 ? 1 : threads;
    float *scratch = malloc((size_t)workers * per_task * sizeof(float));
    if (!scratch) return 1;
#pragma omp parallel for schedule(dynamic) num_threads(workers)
    for (int64_t task = 0; task < tasks; task++) {
        const int64_t b = task / kv_heads, g = task % kv_heads, h = g * group;
        const GradTask t = {
            q + b * q_strides[0] + h * q_strides[1], out + b * out_strides[0] + h * out_strides[1],
            dout + b * dout_strides[0] + h * dout_strides[1],
            q_strides[1], q_strides[2], out_strides[1], out_strides[2], dout_strides[1], dout_strides[2],
            k + b * k_strides[0] + g * k_strides[1], v + b * v_strides[0] + g * v_strides[1], k_strides[2],
            v_strides[2], lse + (b * heads + h) * tq,
            dq + b * dq_strides[0] + h * dq_strides[1], dk + b * dk_strides[0] + g * dk_strides[1],
            dv + b * dv_strides[0] + g * dv_strides[1], dq_strides[1], dq_strides[2], dk_strides[2], dv_strides[2],
        };
        attention_grad_task(&t, scratch + (int64_t)omp_get_thread_num() * per_task, group, tq, tk, d, window, scale);
    }
    free(scratch);
    return 0;
#else
    (void)q, (void)q_strides, (void)k, (void)k_strides, (void)v, (void)v_strides, (void)out, (void)out_strides;
    (void)dout, (void)dout_strides, (void)lse, (void)dq, (void)dq_strides, (void)dk, (void)dk_strides, (void)dv;
    (void)dv_strides, (void)batch, (void)heads, (void)kv_heads, (void)tq, (void)tk, (void)d, (void)window, (void)scale;
    (void)threads;
    return 1;
#endif
}
