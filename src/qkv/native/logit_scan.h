/* One read of a step's logits before a token is chosen (included by decode_step.c with vectors.h, whose lanes_left it
   uses): by the step itself, on each share of W_U's rows while its logits are in the cache of the thread that made
   them, or afterwards (qkv_scan_logits, qkv.native.logit_scan). Per row z of n logits:

       finite  = no z_j is NaN or +-inf              (softmax(z / T) is a distribution only then)
       argmax  = the first j with z_j = max_i z_i     (greedy decoding's token, torch.argmax's tie rule)

   The finiteness test sums z_j - z_j, which is 0 for every finite value and NaN for NaN or an infinity. Each of the
   16 lanes keeps its own maximum and the first column where it appeared (a later equal value does not replace it);
   the lanes holding the maximum then give up the smallest of their columns: the first maximum. Parts of a row
   scanned apart merge the same way (the larger maximum; of equal ones, the smaller column), so the answer does not
   depend on how the row was cut or which thread scanned which part. A row with NaN or inf gets the argmax -1. */

typedef struct {
    float top;    /* the largest value seen */
    int64_t at;   /* its first column; -1: nothing seen yet */
    float junk;   /* the sum of z - z: NaN once a NaN or an infinity was seen */
} Scan;

static const Scan SCAN_NONE = {-INFINITY, -1, 0.0f};

/* s merged with the scan of another part of its row. */
static void scan_merge(Scan *s, const Scan *part) {
    s->junk += part->junk;
    if (s->at < 0 || part->top > s->top || (part->top == s->top && part->at < s->at)) s->top = part->top, s->at = part->at;
}

/* s merged with columns c0 .. c1-1 of the row z (c1 - c0 < 2^31: the columns are kept in 32-bit lanes). */
static void scan_part(const float *z, int64_t c0, int64_t c1, Scan *s) {
    float best = z[c0], junk = 0.0f;
    int64_t at = c0, j = c0;
#if defined(__AVX512F__)
    if (c1 - c0 >= LANES) {
        __m512 top = _mm512_loadu_ps(z + c0), nan = _mm512_sub_ps(top, top);
        __m512i where = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        __m512i column = where;
        const __m512i step = _mm512_set1_epi32(LANES);
        for (j = c0 + LANES; j + LANES <= c1; j += LANES) {
            const __m512 v = _mm512_loadu_ps(z + j);
            column = _mm512_add_epi32(column, step);
            nan = _mm512_add_ps(nan, _mm512_sub_ps(v, v));
            const __mmask16 more = _mm512_cmp_ps_mask(v, top, _CMP_GT_OQ);
            top = _mm512_mask_mov_ps(top, more, v);
            where = _mm512_mask_mov_epi32(where, more, column);
        }
        junk = _mm512_reduce_add_ps(nan);
        best = _mm512_reduce_max_ps(top);
        const __mmask16 holders = _mm512_cmp_ps_mask(top, _mm512_set1_ps(best), _CMP_EQ_OQ);
        at = c0 + _mm512_mask_reduce_min_epi32(holders, where);
    }
#endif
    for (; j < c1; j++) {  /* the tail past the last whole vector, or every column without AVX-512 */
        junk += z[j] - z[j];
        if (z[j] > best) {  /* strictly: an equal value later keeps the first */
            best = z[j];
            at = j;
        }
    }
    const Scan part = {best, at, junk};
    scan_merge(s, &part);
}

/* A row's argmax from its scan: -1 where it holds NaN or inf. */
static int64_t scan_answer(const Scan *s) { return s->junk == s->junk ? s->at : -1; }

/* argmax (rows) of the rows x (rows x n, contiguous), -1 for a row with NaN or inf; returns 1 if any row has. */
int qkv_scan_logits(const float *x, int64_t rows, int64_t n, int64_t *argmax, int32_t threads) {
    int bad = 0;
#pragma omp parallel for schedule(static) num_threads(threads < 1 || rows < 2 ? 1 : threads) reduction(| : bad)
    for (int64_t r = 0; r < rows; r++) {
        Scan s = SCAN_NONE;
        if (n > 0) scan_part(x + r * n, 0, n, &s);
        argmax[r] = scan_answer(&s);
        bad |= argmax[r] < 0;
    }
    return bad;
}
