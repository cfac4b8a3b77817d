/* One decoding step of a decoder-only Transformer (GPT, Llama), B rows of one new token each, in one call.

   The Python step (qkv/decoding/decode_step.py) computes the same numbers with ~15 PyTorch operations per
   block; on a small model (SmolLM2-135M: 30 blocks of 576 wide) their dispatch costs as much as reading the
   weights. Here the whole step is one OpenMP parallel region. The threads meet at five barriers per block,
   between phases that need each other's results. Within a phase each thread multiplies its own contiguous
   share of a matrix's rows and then helps with what is left of the others' (shares.h), and the attention's
   tasks (one row's key/value head) are taken as they come, so a thread the system pauses holds up at most
   one piece:

     each thread: h = norm1(x), prepared for the products     (every thread its own copy: no barrier)
     [q k v] = W_qkv h (+ b)                                   rows of W_qkv               | barrier
     RoPE on q, k; k, v written at the row's position; attention over the cache; prepared (rows x kv heads) | barrier
     x += W_o a (+ b)                                          rows of W_o                 | barrier
     each thread: h = norm2(x);  f = act(W_g h) * (W_1 h)  or  act(W_1 h), prepared         rows of W_g, W_1 | barrier
     x += W_2 f (+ b)                                          rows of W_2                 | barrier
   then the final norm and logits = W_U h (+ b), rows of W_U.

   The cache is the engine's (n_layers, slots, 2, h_kv, L, d_k) float32 pool. Products: products.h; attention:
   attention.h. */

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "products.h"
#include "attention.h"
#include "forward.h"
#include "prompt_attention.h"
#include "attention_backward.h"
#include "swiglu.h"
#include "rms_norm.h"
#include "logit_scan.h"
#include "rotary.h"
#include "cross_entropy.h"
#include "shares.h"
#include "activations.h"

#define CHUNK 64  /* rows of the feed-forward's first half taken at a time: a multiple of 64, so a chunk's outputs
                     are whole block pairs */
#define SHARES_PER_LAYER 4  /* products a block shares out: W_qkv, W_o, W_g and W_1 together, W_2 */

enum { NORM_NONE = 0, NORM_RMS = 1, NORM_LAYER = 2 };

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
    Mat embed;                     /* W_E (vocab, d_model): MAT_F32, or MAT_I8 with scales per row or group; n == 0:
                                      the caller embeds the tokens (positions, other tables) */
    float embed_scale;             /* each row times this (sqrt(d_model) for the paper's scaled embeddings, else 1) */
    const float *positions;        /* a table added to the embedded rows, (positions, d_model): row pos[b] (GPT-2's
                                      learned positions); NULL: none */
} Model;

/* x = W_E[token] * scale, as the embedding modules compute it: int8 levels times their row's or group's scale
   (one float32 product), then times the scale where it is not 1. */
static void embed_row(const Mat *e, float scale, int64_t token, float *x) {
    const int64_t d = e->k;
    if (e->kind == MAT_F32) {
        memcpy(x, (const float *)e->w + token * d, d * sizeof *x);
    } else {
        const int8_t *q = (const int8_t *)e->w + token * d;
        const float *s = e->group ? e->scale + token * (d / e->group) : e->scale + token;
        for (int64_t j = 0; j < d; j++) x[j] = (float)q[j] * s[e->group ? j / e->group : 0];
    }
    if (scale != 1.0f)
        for (int64_t j = 0; j < d; j++) x[j] *= scale;
}

/* sum_j (x_j - shift) (squares 0) or sum_j (x_j - shift)^2 (squares 1): 16 chains of sums, then the rest. */
static float row_sum(const float *x, int64_t d, float shift, int squares) {
    vf acc = {0};
    int64_t j = 0;
    for (; j + LANES <= d; j += LANES) {
        const vf v = load_f(x + j) - shift;
        acc = squares ? fmadd(v, v, acc) : acc + v;
    }
    float sum = hsum(acc);
    for (; j < d; j++) sum += squares ? (x[j] - shift) * (x[j] - shift) : x[j] - shift;
    return sum;
}

static void normalize(const Norm *n, const float *x, float *h, int64_t d) {
    if (n->kind == NORM_NONE) {
        memcpy(h, x, d * sizeof *x);
        return;
    }
    const float mean = n->kind == NORM_LAYER ? row_sum(x, d, 0.0f, 0) / (float)d : 0.0f;
    const float sq = row_sum(x, d, mean, 1);
    float inv = 1.0f / sqrtf(sq / (float)d + n->eps);
    for (int64_t j = 0; j < d; j++) {
        float v = (x[j] - mean) * inv;
        if (n->weight) v *= n->weight[j];
        if (n->bias) v += n->bias[j];
        h[j] = v;
    }
}

/* Rows n0 .. n1-1 of y (+)= W x for all B vectors, MAX_ROWS vectors at a time. */
static void product_range(const Mat *m, const Input *in, int B, float *y, int64_t ldy, int64_t n0, int64_t n1,
                          int add) {
    for (int b0 = 0; b0 < B; b0 += MAX_ROWS) {
        Input part = from(in, b0);
        product(m, &part, B - b0 < MAX_ROWS ? B - b0 : MAX_ROWS, y + b0 * ldy, ldy, n0, n1, add);
    }
}

/* y (+)= W x, its rows shared among the threads (shares.h; no barrier at the end): 16 rows a step (a 576-row
   matrix in 36 steps, so the threads' shares come out even), 64 in a large one (fewer steps to take). */
static void product_shared(const Mat *m, const Input *in, int B, float *y, int64_t ldy, int add, Share *shares) {
    int from = 0;
    int64_t n0, n1;
    while (next_rows(shares, m->n, m->n > 4096 ? 64 : 16, &from, &n0, &n1)) product_range(m, in, B, y, ldy, n0, n1, add);
}

/* The logits y (B, n) = W_U h as product_shared makes them, each share of rows then scanned (logit_scan.h) into
   this thread's scans (B), while it is in this thread's cache. */
static void unembed_scanned(const Mat *m, const Input *in, int B, float *y, Share *shares, Scan *scans) {
    int from = 0;
    int64_t n0, n1;
    while (next_rows(shares, m->n, m->n > 4096 ? 64 : 16, &from, &n0, &n1)) {
        product_range(m, in, B, y, m->n, n0, n1, 0);
        for (int b = 0; b < B; b++) scan_part(y + b * m->n, n0, n1, &scans[b]);
    }
}

/* Every thread: h = norm(x) for B rows (rows[b] of x, or row b when rows is NULL), prepared for the products
   a and b2 (or NULL). */
static void norm_rows(const Norm *n, const float *x, const int64_t *rows, Input *mine, float *h, int B, int64_t d,
                      const Mat *a, const Mat *b2) {
    mine->x = h, mine->ldx = d;
    const int what = prepares(a) > prepares(b2) ? prepares(a) : prepares(b2);
    for (int b = 0; b < B; b++) {
        normalize(n, x + (rows ? rows[b] : b) * d, h + b * d, d);
        prepare_input(mine, b, d, what);
    }
}

/* n bytes rounded up to a whole number of cache lines. Every array of the step starts on a line of its own (the
   memory from aligned_alloc): a vector load of 64 bytes that straddles two lines costs two loads, and at batch 8
   the loads of x bound the float-x products (int8 rows: 26% slower on Emerald Rapids with x 16 bytes off). */
static size_t lines(size_t n) { return (n + 63) / 64 * 64; }

/* The prepared input's arrays for B vectors of up to kmax values and B more, their second roundings (vector
   b + B: Mat.slices 2): their bytes, and the Input over them. */
static size_t input_bytes(int B, int64_t kmax) {
    const int64_t stride = (kmax + 63) / 64 * 64;
    const size_t V = 2 * (size_t)B;
    return lines(V * stride * sizeof(float)) + lines(V * (stride / 64 * LANES) * sizeof(float)) +
           lines(V * (stride / BLOCK) * sizeof(float)) + 2 * lines(V * stride) + 3 * lines(V * stride * sizeof(uint16_t));
}

static Input input_at(void *memory, int B, int64_t kmax) {
    const int64_t stride = (kmax + 63) / 64 * 64;
    const size_t V = 2 * (size_t)B;
    Input in = {.stride = stride, .second = B};
    char *at = memory;
    in.fswapped = (float *)at, at += lines(V * stride * sizeof(float));
    in.scales = (float *)at, at += lines(V * (stride / 64 * LANES) * sizeof(float));
    in.sums = (float *)at, at += lines(V * (stride / BLOCK) * sizeof(float));
    in.offq = (uint8_t *)at, at += lines(V * stride);
    in.swapped = (int8_t *)at, at += lines(V * stride);
    in.xh = (uint16_t *)at, at += lines(V * stride * sizeof(uint16_t));
    in.x16 = (int16_t *)at, at += lines(V * stride * sizeof(int16_t));
    in.x16s = (int16_t *)at;
    return in;
}

/* Attention of every row and key/value head; each task prepares its heads' outputs for W_o when their blocks are
   its own (group d_k a multiple of 64), else one pass over the rows does it after a barrier. Rows that share a
   cache row (several new tokens of one text) first all write their keys and values, then attend. */
static void attention_phase(const Model *m, const Layer *layer, int B, const float *qkv, int64_t width, float *kv,
                            const int64_t *slots, int shared, int64_t row_stride, int64_t L, const int64_t *pos,
                            Input *att_in, float *scores, float *q) {
    const int group = m->n_heads / m->n_kv_heads, span = group * m->head_dim, d = m->d_model;
    const Heads heads = {d, m->n_kv_heads, group, m->head_dim, layer->window, m->rope ? m->cos : NULL, m->sin};
    const int what = prepares(&layer->out), own = span % 64 == 0;
    if (shared) {
#pragma omp for schedule(static) collapse(2)
        for (int b = 0; b < B; b++)
            for (int g = 0; g < m->n_kv_heads; g++)
                write_kv(&heads, qkv + b * width, kv + slots[b] * row_stride, L, pos[b], g);
    }
#pragma omp for schedule(dynamic) collapse(2) nowait
    for (int b = 0; b < B; b++)
        for (int g = 0; g < m->n_kv_heads; g++) {
            float *row = kv + slots[b] * row_stride;
            if (!shared) write_kv(&heads, qkv + b * width, row, L, pos[b], g);
            attend(&heads, qkv + b * width, row, L, pos[b], g, (float *)att_in->x + b * d, scores, q);
            if (what && own)  /* the last head group also prepares the zero blocks past d */
                prepare_blocks(att_in, b, d, g * span / BLOCK,
                               g == m->n_kv_heads - 1 ? att_in->stride / BLOCK : (g + 1) * span / BLOCK, what);
        }
#pragma omp barrier
    if (what && !own) {
#pragma omp for schedule(static)
        for (int b = 0; b < B; b++) prepare_input(att_in, b, d, what);
    }
}

/* The feed-forward's first half for rows of W_g / W_1 in chunks: f = act(W_g h) * (W_1 h) or act(W_1 h), each
   chunk's outputs prepared for W_2 by the thread that made them. */
static void feed_forward_phase(const Model *m, const Layer *layer, int B, const Input *mine, float *gate,
                               Input *f_in, Share *shares) {
    const int64_t ff = m->d_ff;
    const int what = prepares(&layer->down);
    float *f = (float *)f_in->x;
    int from = 0;
    int64_t n0, n1;
    while (next_rows(shares, ff, CHUNK, &from, &n0, &n1)) {
        if (layer->gate.n) product_range(&layer->gate, mine, B, gate, ff, n0, n1, 0);
        product_range(&layer->up, mine, B, f, ff, n0, n1, 0);
        activate_rows(m->act, layer->gate.n ? gate : NULL, f, B, ff, n0, n1);
        for (int b = 0; b < B; b++)
            prepare_blocks(f_in, b, ff, n0 / BLOCK, n1 == ff ? f_in->stride / BLOCK : n1 / BLOCK, what);
    }
#pragma omp barrier
}

/* The step. Row b feeds the token whose embedding is x0[b] (x0 NULL: W_E's row tokens[b], m->embed) at position
   pos[b] of cache row slots[b]; rows may share a cache row (shared != 0), at distinct positions: one text's new
   tokens, each seeing those before it. logits (n_out, vocab) are those of rows outputs[0 .. n_out - 1] (outputs
   NULL: of every row, B of them); argmax (n_out), unless NULL, each one's first largest logit, -1 where it holds NaN
   or inf (logit_scan.h). */
int qkv_decode_step(const Model *m, int32_t B, const float *x0, const int64_t *tokens, const int64_t *pos,
                    const int64_t *slots, int32_t shared, const int64_t *outputs, int32_t n_out, float *cache,
                    int64_t layer_stride, int64_t row_stride, int64_t L, float *logits, int64_t *argmax,
                    int32_t threads) {
    const int64_t d = m->d_model, dk = m->head_dim, ff = m->d_ff, group = m->n_heads / m->n_kv_heads;
    const int64_t width = d + 2 * (int64_t)m->n_kv_heads * dk;
    /* shared: x, qkv, att, gate, f, and the prepared att and f; each thread's: h, scores, q, its prepared h */
    const size_t f32 = sizeof(float), bd = lines(B * d * f32), bff = lines(B * ff * f32), bw = lines(B * width * f32);
    const size_t bscores = lines(group * L * f32), bq = lines(group * dk * f32);
    const size_t common = 2 * bd + bw + 2 * bff + input_bytes(B, d) + input_bytes(B, ff);
    const size_t bscan = lines(B * sizeof(Scan));
    const size_t own = bd + bscores + bq + input_bytes(B, d) + bscan;
    char *memory = aligned_alloc(64, common + (size_t)threads * own);
    /* each product's shares of rows: SHARES_PER_LAYER per block, then the unembedding's; one per thread */
    const size_t share_bytes = ((size_t)m->n_layers * SHARES_PER_LAYER + 1) * threads * sizeof(Share);
    Share *shares = aligned_alloc(sizeof(Share), share_bytes);
    if (!memory || !shares) {
        free(memory), free(shares);
        return 1;
    }
    memset(shares, 0, share_bytes);
    float *x = (float *)memory, *qkv = (float *)((char *)x + bd), *att = (float *)((char *)qkv + bw);
    float *gate = (float *)((char *)att + bd), *f = (float *)((char *)gate + bff);
    char *prepared = (char *)f + bff;
    Input att_in = input_at(prepared, B, d), f_in = input_at(prepared + input_bytes(B, d), B, ff);
    att_in.x = att, att_in.ldx = d, f_in.x = f, f_in.ldx = ff;
    if (x0)
        memcpy(x, x0, (size_t)B * d * sizeof(float));
    else
        for (int b = 0; b < B; b++) {
            embed_row(&m->embed, m->embed_scale, tokens[b], x + b * d);
            if (m->positions)
                for (int64_t j = 0; j < d; j++) x[b * d + j] += m->positions[pos[b] * d + j];
        }

#define THREAD_SCANS(t) ((Scan *)(memory + common + (size_t)(t) * own + own - bscan))  /* the end of t's memory */
    for (int t = 0; argmax && t < threads; t++)  /* each thread's scans of W_U's rows (a thread the team lacks: none) */
        for (int b = 0; b < B; b++) THREAD_SCANS(t)[b] = SCAN_NONE;
#pragma omp parallel num_threads(threads)
    {
        char *mem = memory + common + (size_t)omp_get_thread_num() * own;
        float *h = (float *)mem, *scores = (float *)(mem + bd), *q = (float *)((char *)scores + bscores);
        Input mine = input_at((char *)q + bq, B, d);
        Scan *scans = THREAD_SCANS(omp_get_thread_num());
        for (int l = 0; l < m->n_layers; l++) {
            const Layer *layer = &m->layers[l];
            Share *ours = shares + (size_t)l * SHARES_PER_LAYER * threads;
            norm_rows(&layer->norm1, x, NULL, &mine, h, B, d, &layer->qkv, NULL);
            product_shared(&layer->qkv, &mine, B, qkv, width, 0, ours);
#pragma omp barrier
            attention_phase(m, layer, B, qkv, width, cache + l * layer_stride, slots, shared, row_stride, L, pos, &att_in,
                            scores, q);
            product_shared(&layer->out, &att_in, B, x, d, 1, ours + threads);
#pragma omp barrier
            norm_rows(&layer->norm2, x, NULL, &mine, h, B, d, &layer->up, layer->gate.n ? &layer->gate : NULL);
            feed_forward_phase(m, layer, B, &mine, gate, &f_in, ours + 2 * threads);
            product_shared(&layer->down, &f_in, B, x, d, 1, ours + 3 * threads);
#pragma omp barrier
        }
        const int rows = outputs ? n_out : B;
        Share *last = shares + (size_t)m->n_layers * SHARES_PER_LAYER * threads;
        norm_rows(&m->final_norm, x, outputs, &mine, h, rows, d, &m->unembed, NULL);
        if (argmax)
            unembed_scanned(&m->unembed, &mine, rows, logits, last, scans);
        else
            product_shared(&m->unembed, &mine, rows, logits, m->vocab, 0, last);
    }
    for (int b = 0; argmax && b < (outputs ? n_out : B); b++) {  /* the threads' parts of each row, merged */
        Scan s = SCAN_NONE;
        for (int t = 0; t < threads; t++) {
            const Scan *part = THREAD_SCANS(t) + b;
            if (part->at >= 0) scan_merge(&s, part);  /* a thread that took none of W_U's rows saw nothing */
        }
        argmax[b] = scan_answer(&s);
    }
#undef THREAD_SCANS
    free(memory), free(shares);
    return 0;
}

/* Whether MAT_I8 products multiply x in bfloat16 (int8_bf16(): for k a multiple of 32), for the tests' reference. */
int qkv_int8_in_bfloat16(void) { return int8_bf16(); }

/* Which kernels read Mat.lanes: 2 VNNI's (int4_lanes.h, int8_lanes.h: lane_off too), 1 AVX2's (lanes_avx2.h, no
   lane_off), 0 none (the rows compute every layer). */
int qkv_lane_kernels(void) { return HAVE_VNNI ? 2 : AVX2 ? 1 : 0; }

/* Overrides int8_bf16()'s choice: 1 bfloat16 (where the CPU has it), 0 float32, -1 the CPU's (tests). */
void qkv_set_int8_bf16(int32_t choice) { int8_bf16_choice = choice; }

/* Vectors of a many-vector product (a prompt) taken together: the int8 blocks of 64 vectors of up to 1536 values
   stay in L2 cache while every share of rows reads them. */
#define PRODUCT_VECTORS 64

/* y = W x (+ b) for B vectors x (B, k) into y (B, n): one product alone, as the step computes it (tests), and a
   prompt's product of an int4 layer with int8 activations (qkv_int4_lanes_product). The threads round x's rows
   among them, then take PRODUCT_VECTORS vectors at a time, each time sharing W's rows afresh. */
int qkv_product(const Mat *m, int32_t B, const float *x, float *y, int32_t threads) {
    void *memory = aligned_alloc(64, input_bytes(B, m->k));
    const int64_t parts = (B + PRODUCT_VECTORS - 1) / PRODUCT_VECTORS;
    Share *shares = aligned_alloc(sizeof(Share), (size_t)(parts * threads) * sizeof(Share));
    if (!memory || !shares) {
        free(memory), free(shares);
        return 1;
    }
    memset(shares, 0, (size_t)(parts * threads) * sizeof(Share));
    Input in = input_at(memory, B, m->k);
    in.x = x, in.ldx = m->k;
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
        for (int b = 0; b < B; b++) prepare_input(&in, b, m->k, prepares(m));
        for (int64_t p = 0; p < parts; p++) {  /* after the loop's barrier; no barrier between parts */
            const int b0 = (int)(p * PRODUCT_VECTORS), nb = B - b0 < PRODUCT_VECTORS ? B - b0 : PRODUCT_VECTORS;
            const Input part = from(&in, b0);
            product_shared(m, &part, nb, y + (int64_t)b0 * m->n, m->n, 0, shares + p * threads);
        }
    }
    free(memory), free(shares);
    return 0;
}

/* y = W x (+ b) of an int4 layer (n, k) whose int8 activations are rounded once (MAT_I4), for B vectors: its
   row-major levels q4 with s16, m16 per group, and the first n / 16 * 16 rows repacked 16 to a vector (lanes,
   lane_s, lane_m). The product of a prompt (quantization/native_forward.py), with the step's own numbers. */
int qkv_int4_lanes_product(int32_t n, int32_t k, int32_t group, const uint8_t *q4, const uint16_t *s16,
                           const uint16_t *m16, const float *bias, const uint8_t *lanes, const uint16_t *lane_s,
                           const uint16_t *lane_m, int32_t B, const float *x, float *y, int32_t threads) {
    const Mat m = {.kind = MAT_I4, .n = n, .k = k, .group = group, .w = q4, .s16 = s16, .m16 = m16, .bias = bias,
                   .lanes = lanes, .lane_s = lane_s, .lane_m = lane_m, .slices = 1};
    return qkv_product(&m, B, x, y, threads);
}
