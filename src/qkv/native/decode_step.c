/* One decoding step of a decoder-only Transformer (GPT, Llama), B rows of one new token each, in one call.

   The Python step (qkv/decoding/decode_step.py) computes the same numbers with ~15 PyTorch operations per
   block; on a small model (SmolLM2-135M: 30 blocks of 576 wide) their dispatch costs as much as reading the
   weights. Here a block is a few loops inside one OpenMP parallel region for the whole step, the threads
   meeting at a barrier between the phases that need each other's results:

     h = norm1(x)                     each thread: its rows b           then prepare h for the products
     [q k v] = W_qkv h (+ b)          each thread: a slice of W's rows
     rotate q, k (RoPE); write k, v at the row's position; attention over the cached keys   (rows x kv heads)
     x += W_o a (+ b)                 a slice of W_o's rows
     h = norm2(x)
     f = act(W_g h) * (W_1 h)  or  act(W_1 h)         a slice of rows of W_g and W_1
     x += W_2 f (+ b)
   then the final norm and logits = W_U h (+ b), a slice of W_U's rows each.

   The cache is the engine's (n_layers, slots, 2, h_kv, L, d_k) float32 pool, row b at slot b; row b's new key
   and value go to position pos[b], and its query sees keys pos[b] - window < j <= pos[b] (window 0: all
   j <= pos[b]). Query head i reads key/value head i / (h / h_kv) (grouped-query attention). */

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "products.h"

enum { NORM_NONE = 0, NORM_RMS = 1, NORM_LAYER = 2 };
enum { ACT_RELU = 0, ACT_GELU = 1, ACT_GELU_TANH = 2, ACT_SILU = 3, ACT_RELU2 = 4 };

typedef struct {
    int32_t kind;
    float eps;
    const float *weight, *bias;  /* (d,) or NULL */
} Norm;

typedef struct {
    Norm norm1, norm2;
    Mat qkv, out, gate, up, down;  /* gate.n == 0: a plain feed-forward act(W_1 h) */
    int32_t window;                /* 0: none */
} Layer;

typedef struct {
    int32_t n_layers, d_model, n_heads, n_kv_heads, head_dim, d_ff, vocab, act;
    int32_t rope, rope_len;        /* rope: 1 = rotate pairs (i, i + d_k / 2) by cos/sin (rope_len, d_k) */
    const float *cos, *sin;
    Norm final_norm;
    Mat unembed;
    const Layer *layers;
} Model;

static void normalize(const Norm *n, const float *x, float *h, int64_t d) {
    if (n->kind == NORM_NONE) {
        memcpy(h, x, d * sizeof *x);
        return;
    }
    float mean = 0.0f;
    if (n->kind == NORM_LAYER) {
        for (int64_t j = 0; j < d; j++) mean += x[j];
        mean /= (float)d;
    }
    float sq = 0.0f;
    for (int64_t j = 0; j < d; j++) sq += (x[j] - mean) * (x[j] - mean);
    float inv = 1.0f / sqrtf(sq / (float)d + n->eps);
    for (int64_t j = 0; j < d; j++) {
        float v = (x[j] - mean) * inv;
        if (n->weight) v *= n->weight[j];
        if (n->bias) v += n->bias[j];
        h[j] = v;
    }
}

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
                vf acc = {0};
                for (int c = 0; c < vecs; c++) acc += load_f(q + c * LANES) * load_f(key + c * LANES);
                s = hsum(acc);
            } else {
                s = 0.0f;
                for (int c = 0; c < d; c++) s += q[c] * key[c];
            }
            p[j] = s * scale;
            top = p[j] > top ? p[j] : top;
        }
        for (int64_t j = first; j <= last; j++) total += p[j] = expf(p[j] - top);
        float *o = out + h * d;
        if (DK) {
            vf acc[DK ? DK / LANES : 1];
            for (int c = 0; c < vecs; c++) acc[c] = (vf){0};
            for (int64_t j = first; j <= last; j++)
                for (int c = 0; c < vecs; c++) acc[c] += p[j] * load_f(values + j * d + c * LANES);
            for (int c = 0; c < vecs; c++) {
                vf r = acc[c] / total;
                memcpy(o + c * LANES, &r, sizeof r);
            }
        } else {
            for (int c = 0; c < d; c++) o[c] = 0.0f;
            for (int64_t j = first; j <= last; j++)
                for (int c = 0; c < d; c++) o[c] += p[j] * values[j * d + c];
            for (int c = 0; c < d; c++) o[c] /= total;
        }
    }
}

/* Row b, key/value head g: write its key (rotated) and value at pos, then attention of its query heads. */
static void attend(const Model *m, const Layer *layer, const float *qkv, float *kv, int64_t L, int64_t pos, int g,
                   float *att, float *scores, float *q) {
    const int dk = m->head_dim, group = m->n_heads / m->n_kv_heads;
    float *keys = kv + (int64_t)g * L * dk, *values = kv + ((int64_t)m->n_kv_heads + g) * L * dk;
    const float *cos = m->rope ? m->cos + pos * dk : NULL, *sin = m->rope ? m->sin + pos * dk : NULL;
    memcpy(keys + pos * dk, qkv + m->d_model + (int64_t)g * dk, dk * sizeof(float));
    memcpy(values + pos * dk, qkv + m->d_model + (int64_t)(m->n_kv_heads + g) * dk, dk * sizeof(float));
    memcpy(q, qkv + (int64_t)g * group * dk, (size_t)group * dk * sizeof(float));
    if (m->rope) {
        rotate(keys + pos * dk, cos, sin, dk);
        for (int h = 0; h < group; h++) rotate(q + h * dk, cos, sin, dk);
    }
    int64_t first = layer->window > 0 && pos - layer->window + 1 > 0 ? pos - layer->window + 1 : 0;
    float *out = att + (int64_t)g * group * dk;
    if (dk == 64)
        attend_heads(64, dk, group, q, keys, values, first, pos, scores, out);
    else if (dk == 128)
        attend_heads(128, dk, group, q, keys, values, first, pos, scores, out);
    else
        attend_heads(0, dk, group, q, keys, values, first, pos, scores, out);
}

/* f = act(f) (or act(g) * f, gated) over entries n0 .. n1-1 of B rows of width ff: one loop per function. */
static void activate_rows(int act, const float *g, float *f, int B, int64_t ff, int64_t n0, int64_t n1) {
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

/* This thread's share [*n0, *n1) of n rows, cut at multiples of 16. */
static inline void share(int64_t n, int64_t *n0, int64_t *n1) {
    int t = omp_get_thread_num(), T = omp_get_num_threads();
    int64_t chunk = ((n + T - 1) / T + 15) / 16 * 16;
    *n0 = t * chunk < n ? t * chunk : n;
    *n1 = *n0 + chunk < n ? *n0 + chunk : n;
}

/* The input from vector b0 on. */
static Input from(const Input *in, int b0) {
    Input part = *in;
    part.x += b0 * in->ldx, part.absq += b0 * in->stride, part.swapped += b0 * in->stride;
    part.signs += b0 * (in->stride / 64), part.scales += b0 * (in->stride / 64 * LANES);
    part.sums += b0 * (in->stride / BLOCK);
    return part;
}

/* y (+)= W x for all B vectors, in chunks of MAX_ROWS vectors: this thread's rows of W. */
static void product_share(const Mat *m, const Input *in, int B, float *y, int64_t ldy, int add) {
    int64_t n0, n1;
    share(m->n, &n0, &n1);
    for (int b0 = 0; b0 < B; b0 += MAX_ROWS) {
        Input part = from(in, b0);
        product(m, &part, B - b0 < MAX_ROWS ? B - b0 : MAX_ROWS, y + b0 * ldy, ldy, n0, n1, add);
    }
}

static int rounds_x(const Mat *m) { return m && m->n > 0 && (m->kind == MAT_I8A8 || m->kind == MAT_I4); }

/* Prepare input vector b of k values (already in in->x) for the products of a and b2 (or NULL). */
static void prepare_for(Input *in, int b, int64_t k, const Mat *a, const Mat *b2) {
    if (rounds_x(a) || rounds_x(b2)) prepare_input(in, b, k);
}

/* Scratch memory of a step or a product: the prepared input's arrays for B vectors of up to kmax values. */
static size_t input_bytes(int B, int64_t kmax) {
    int64_t stride = (kmax + 63) / 64 * 64;
    return (size_t)B * (2 * stride + stride / 64 * (sizeof(uint64_t) + LANES * sizeof(float)) + stride / BLOCK * sizeof(float));
}

static Input input_at(void *memory, int B, int64_t kmax) {
    int64_t stride = (kmax + 63) / 64 * 64;
    Input in = {.stride = stride};
    float *f = memory;
    in.scales = f, f += B * (stride / 64 * LANES);
    in.sums = f, f += B * (stride / BLOCK);
    in.signs = (uint64_t *)f;
    in.absq = (uint8_t *)(in.signs + B * (stride / 64));
    in.swapped = (int8_t *)(in.absq + B * stride);
    return in;
}

int qkv_decode_step(const Model *m, int32_t B, const float *x0, const int64_t *pos, float *cache,
                    int64_t layer_stride, int64_t row_stride, int64_t L, float *logits, int32_t threads) {
    const int64_t d = m->d_model, dk = m->head_dim, ff = m->d_ff;
    const int64_t width = d + 2 * (int64_t)m->n_kv_heads * dk, kmax = d > ff ? d : ff;
    const int64_t per_thread = (int64_t)(m->n_heads / m->n_kv_heads) * (L + dk);
    size_t floats = (size_t)B * (d + d + width + d + 2 * ff) + (size_t)threads * per_thread;
    float *buf = malloc(floats * sizeof(float) + input_bytes(B, kmax));
    if (!buf) return 1;
    float *x = buf, *h = x + B * d, *qkv = h + B * d, *att = qkv + B * width, *gate = att + B * d;
    float *up = gate + B * ff, *scratch = up + B * ff;
    Input in = input_at(scratch + (size_t)threads * per_thread, B, kmax);
    memcpy(x, x0, (size_t)B * d * sizeof(float));

#pragma omp parallel num_threads(threads)
    {
        float *scores = scratch + (size_t)omp_get_thread_num() * per_thread;
        float *q = scores + (int64_t)(m->n_heads / m->n_kv_heads) * L;
        Input mine = in;
        for (int l = 0; l < m->n_layers; l++) {
            const Layer *layer = &m->layers[l];
            mine.x = h, mine.ldx = d;
#pragma omp for schedule(static)
            for (int b = 0; b < B; b++) {
                normalize(&layer->norm1, x + b * d, h + b * d, d);
                prepare_for(&mine, b, d, &layer->qkv, NULL);
            }
            product_share(&layer->qkv, &mine, B, qkv, width, 0);
#pragma omp barrier
#pragma omp for schedule(static) collapse(2)
            for (int b = 0; b < B; b++)
                for (int g = 0; g < m->n_kv_heads; g++)
                    attend(m, layer, qkv + b * width, cache + l * layer_stride + b * row_stride, L, pos[b], g,
                           att + b * d, scores, q);
            mine.x = att, mine.ldx = d;
#pragma omp for schedule(static)
            for (int b = 0; b < B; b++) prepare_for(&mine, b, d, &layer->out, NULL);
            product_share(&layer->out, &mine, B, x, d, 1);
#pragma omp barrier
            mine.x = h, mine.ldx = d;
#pragma omp for schedule(static)
            for (int b = 0; b < B; b++) {
                normalize(&layer->norm2, x + b * d, h + b * d, d);
                prepare_for(&mine, b, d, &layer->up, layer->gate.n ? &layer->gate : NULL);
            }
            {
                int64_t n0, n1;
                share(ff, &n0, &n1);
                if (layer->gate.n) {
                    for (int b0 = 0; b0 < B; b0 += MAX_ROWS) {
                        Input part = from(&mine, b0);
                        int rows = B - b0 < MAX_ROWS ? B - b0 : MAX_ROWS;
                        product(&layer->gate, &part, rows, gate + b0 * ff, ff, n0, n1, 0);
                        product(&layer->up, &part, rows, up + b0 * ff, ff, n0, n1, 0);
                    }
                    activate_rows(m->act, gate, up, B, ff, n0, n1);
                } else {
                    for (int b0 = 0; b0 < B; b0 += MAX_ROWS) {
                        Input part = from(&mine, b0);
                        int rows = B - b0 < MAX_ROWS ? B - b0 : MAX_ROWS;
                        product(&layer->up, &part, rows, up + b0 * ff, ff, n0, n1, 0);
                    }
                    activate_rows(m->act, NULL, up, B, ff, n0, n1);
                }
            }
#pragma omp barrier
            mine.x = up, mine.ldx = ff;
#pragma omp for schedule(static)
            for (int b = 0; b < B; b++) prepare_for(&mine, b, ff, &layer->down, NULL);
            product_share(&layer->down, &mine, B, x, d, 1);
#pragma omp barrier
        }
        mine.x = h, mine.ldx = d;
#pragma omp for schedule(static)
        for (int b = 0; b < B; b++) {
            normalize(&m->final_norm, x + b * d, h + b * d, d);
            prepare_for(&mine, b, d, &m->unembed, NULL);
        }
        product_share(&m->unembed, &mine, B, logits, m->vocab, 0);
    }
    free(buf);
    return 0;
}

/* y = W x (+ b) for B vectors x (B, k) into y (B, n): one product alone, as the step computes it (tests). */
int qkv_product(const Mat *m, int32_t B, const float *x, float *y, int32_t threads) {
    void *memory = malloc(input_bytes(B, m->k));
    if (!memory) return 1;
    Input in = input_at(memory, B, m->k);
    in.x = x, in.ldx = m->k;
    for (int b = 0; b < B; b++) prepare_for(&in, b, m->k, m, NULL);
#pragma omp parallel num_threads(threads)
    product_share(m, &in, B, y, m->n, 0);
    free(memory);
    return 0;
}
