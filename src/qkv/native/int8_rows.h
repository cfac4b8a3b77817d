/* Rows of int8 weights times B vectors, for products.h, which includes this file after its float rows: MAT_I8A8
   (x rounded to int8 blocks, VNNI) and MAT_I8: where int8_bf16() picks the CPU's bfloat16 dot products, x in
   bfloat16 (row_i8h); elsewhere x in float32 (rows_i8f).

   row_i8h: each 32 weights of a row are widened to bfloat16, which holds every level -127..127 exactly (with
   scales per group: s Q, rounded to bfloat16, 2^-9 of a weight at most), and multiplied by x in bfloat16
   (Input.xh, rounded to nearest even) with AVX512_BF16's dot products, 32 products per instruction into 16
   float32 sums, twice as many as an FMA does; the sums stay float32. The products are those of the layer's
   PyTorch forward (Int8Linear: its int8 kernel, and a prompt's bfloat16 product, round x alike). At batch 8,
   where float32 FMAs and loads of x bound the float32 rows (on AMD), it takes half the time. Two chains of sums per vector, in
   the same order whatever B is. */

#if HAVE_VNNI
/* The k bytes from p, zero past k (k a multiple of 32): the weights of 64 columns, or of the last 32. */
static inline __m512i load_bytes(const void *p, int64_t left) {
    return left >= 64 ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi8(0xFFFFFFFFull, p);
}
#endif

/* A row w of int8 weights times B vectors rounded to int8 blocks: out (B). With gs (groups of `group` columns,
   a multiple of 32), each block's x scale d_c is multiplied by its group's scale s_c; NULL: the caller scales
   the row's sums by its one scale. VNNI multiplies unsigned bytes by signed ones: x comes as xq + 128 (Input.offq),
   and the dots start from -128 times the weights' sums, computed once per 64 weights for all B vectors. (x as
   |xq| with its signs moved onto the weights cost two more instructions per vector: W8A8 at batch 8 was 11-18%
   slower.) */
INLINE void row_i8a8(const int8_t *w, int64_t k, const float *gs, int64_t group, const Input *in, int B,
                     float *out) {
#if HAVE_VNNI
    __m512 acc[MAX_ROWS];
    for (int b = 0; b < B; b++) acc[b] = _mm512_setzero_ps();
    const int shift = group > 0 && (group & (group - 1)) == 0 ? __builtin_ctzll((unsigned long long)group) : -1;
    const __m512i pair = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    for (int64_t j = 0; j < k; j += 64) {
        __builtin_prefetch(w + j + PREFETCH_INT8, 0, 1);
        __m512i wv = load_bytes(w + j, k - j);
        __m512 s = _mm512_setzero_ps();
        if (gs && group == BLOCK && j + BLOCK < k) {  /* [s of block c x8, s of block c + 1 x8]: two floats */
            s = _mm512_permutexvar_ps(pair, _mm512_castps128_ps512(_mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)(gs + j / BLOCK)))));
        } else if (gs) {  /* (block c + 1 past k: its dots are 0) */
            const float s0 = gs[shift >= 0 ? j >> shift : j / group];
            const float s1 = j + BLOCK < k ? gs[shift >= 0 ? (j + BLOCK) >> shift : (j + BLOCK) / group] : s0;
            s = _mm512_insertf32x8(_mm512_set1_ps(s0), _mm256_set1_ps(s1), 1);
        }
        /* -128 times the sums of each 4 weights: (xq + 128) . w + this = xq . w, for every vector */
        const __m512i offset = _mm512_sub_epi32(_mm512_setzero_si512(),
                                                _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8((char)0x80), wv));
        for (int b = 0; b < B; b++) {
            __m512i x = _mm512_loadu_si512((const void *)(in->offq + b * in->stride + j));
            __m512i dots = _mm512_dpbusd_epi32(offset, x, wv);  /* lanes 0-7, 8-15: a block */
            __m512 d = _mm512_loadu_ps(in->scales + b * (in->stride / 64 * LANES) + j / 64 * LANES);
            if (gs) d = _mm512_mul_ps(d, s);
            acc[b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots), d, acc[b]);
        }
    }
    for (int b = 0; b < B; b++) out[b] = _mm512_reduce_add_ps(acc[b]);
#elif AVX2
    row_i8a8_avx2(w, k, gs, group, in, B, out);
#else
    for (int b = 0; b < B; b++) {
        const uint8_t *offq = in->offq + b * in->stride;
        const float *scales = in->scales + b * (in->stride / 64 * LANES);
        float total = 0.0f;
        for (int64_t c = 0; c < k / BLOCK; c++) {
            int32_t dot = 0;
            for (int64_t j = c * BLOCK; j < (c + 1) * BLOCK; j++) {
                int32_t q = (int32_t)offq[j] - 128;
                dot += q * (int32_t)w[j];
            }
            float d = scales[(c / 2) * LANES + (c % 2) * (LANES / 2)];
            total += (float)dot * (gs ? d * gs[c * BLOCK / group] : d);
        }
        out[b] = total;
    }
#endif
}

/* R rows of int8 weights (MAT_I8 in float32), `ldw` bytes apart, times B vectors: out[r * MAX_ROWS + b]. With gs
   (groups of `group` columns, a multiple of 32, as k; gs_ld floats between the rows' scales), each 32 weights
   are scaled by their group's before the FMAs. R rows share each load of x (one row at a time, with two chains
   per vector, took 8-28% longer on Emerald Rapids: its loads of x and its reductions); one chain of sums per row
   and vector, in the same order whatever R and B are (a vector's numbers never depend on the others). */
INLINE void rows_i8f(const int8_t *w, int64_t ldw, const int R, int64_t k, const float *gs, int64_t gs_ld,
                     int64_t group, const Input *in, int B, float *out) {
    vf acc[4][MAX_ROWS];
    for (int r = 0; r < R; r++)
        for (int b = 0; b < B; b++) acc[r][b] = (vf){0};
    const int shift = group > 0 && (group & (group - 1)) == 0 ? __builtin_ctzll((unsigned long long)group) : -1;
    int64_t j = 0;
    for (; j + 2 * LANES <= k; j += 2 * LANES) {
        vf a[4], c[4];
        for (int r = 0; r < R; r++) {
            __builtin_prefetch(w + r * ldw + j + PREFETCH_INT8, 0, 1);
            a[r] = load_i8(w + r * ldw + j), c[r] = load_i8(w + r * ldw + j + LANES);
            if (gs) {
                const float scale = gs[r * gs_ld + (shift >= 0 ? j >> shift : j / group)];
                a[r] *= scale, c[r] *= scale;
            }
        }
        for (int b = 0; b < B; b++) {
            const vf x0 = load_f(in->x + b * in->ldx + j), x1 = load_f(in->x + b * in->ldx + j + LANES);
            for (int r = 0; r < R; r++) acc[r][b] = fmadd(c[r], x1, fmadd(a[r], x0, acc[r][b]));
        }
    }
    for (int r = 0; r < R; r++)
        for (int b = 0; b < B; b++) {
            float sum = hsum(acc[r][b]);
            for (int64_t t = j; t < k; t++)
                sum += (float)w[r * ldw + t] * (gs ? gs[r * gs_ld + t / group] : 1.0f) * in->x[b * in->ldx + t];
            out[r * MAX_ROWS + b] = sum;
        }
}

#if I8_BF16
/* 32 int8 weights from p as bfloat16 (times the scale s, with scales per group). */
static inline __m512bh widen_i8(const int8_t *p, const float *s) {
    __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
    __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p + LANES))));
    if (s) {
        lo = _mm512_mul_ps(lo, _mm512_set1_ps(*s));
        hi = _mm512_mul_ps(hi, _mm512_set1_ps(*s));
    }
    return _mm512_cvtne2ps_pbh(hi, lo);  /* columns 0-15 from lo, 16-31 from hi */
}

/* A row w of int8 weights (k a multiple of 32) times B vectors in bfloat16: out (B). With gs (groups of `group`
   columns, a multiple of 32), the row's group scales inside the weights; NULL: the caller scales the sums. */
INLINE void row_i8h(const int8_t *w, int64_t k, const float *gs, int64_t group, const Input *in, int B,
                    float *out) {
    __m512 acc0[MAX_ROWS], acc1[MAX_ROWS];
    for (int b = 0; b < B; b++) acc0[b] = acc1[b] = _mm512_setzero_ps();
    const int shift = group > 0 && (group & (group - 1)) == 0 ? __builtin_ctzll((unsigned long long)group) : -1;
#define SCALE(j) (gs ? gs + (shift >= 0 ? (j) >> shift : (j) / group) : NULL)
    int64_t j = 0;
    for (; j + 2 * BLOCK <= k; j += 2 * BLOCK) {
        __builtin_prefetch(w + j + PREFETCH_INT8, 0, 1);
        __m512bh a = widen_i8(w + j, SCALE(j)), c = widen_i8(w + j + BLOCK, SCALE(j + BLOCK));
        for (int b = 0; b < B; b++) {
            const uint16_t *x = in->xh + b * in->stride + j;
            acc0[b] = _mm512_dpbf16_ps(acc0[b], a, (__m512bh)_mm512_loadu_si512((const void *)x));
            acc1[b] = _mm512_dpbf16_ps(acc1[b], c, (__m512bh)_mm512_loadu_si512((const void *)(x + BLOCK)));
        }
    }
    if (j < k) {  /* the last 32 columns */
        __m512bh a = widen_i8(w + j, SCALE(j));
        for (int b = 0; b < B; b++) {
            const uint16_t *x = in->xh + b * in->stride + j;
            acc0[b] = _mm512_dpbf16_ps(acc0[b], a, (__m512bh)_mm512_loadu_si512((const void *)x));
        }
    }
#undef SCALE
    for (int b = 0; b < B; b++) out[b] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[b], acc1[b]));
}
#endif
