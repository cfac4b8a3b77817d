/* Preparing a product's inputs (products.h): each block of 32 values of x rounded to int8 with its own step,

       d_c = max_j |x_cj| / 127,      xq_cj = round(x_cj / d_c)   (nearest, ties to even),

   in the forms the kernels read (Input: xq + 128 in column order, xq and x with each block's even columns first,
   the steps, d_c sum_j xq_cj), and x in bfloat16 where int8 rows multiply in it. The same numbers on every path:
   AVX-512, AVX2 (8 values at a time) and the scalar loop. */

/* Block c of 32 values (zeros past k): its int8 levels into the arrays of vector b; returns their sum. */
static inline int32_t round_block(const Input *in, int b, int64_t c, const float *xc, float inv) {
    int64_t at = c * BLOCK;
    uint8_t *offq = in->offq + b * in->stride + at;
    int8_t *swapped = in->swapped + b * in->stride + at;
    float *fswapped = in->fswapped + b * in->stride + at;
#if defined(__AVX512BW__)
    __m512i lo = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xc), _mm512_set1_ps(inv)));  /* nearest, ties even */
    __m512i hi = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xc + LANES), _mm512_set1_ps(inv)));
    __m128i q0 = _mm512_cvtepi32_epi8(lo), q1 = _mm512_cvtepi32_epi8(hi);
    __m256i q = _mm256_inserti128_si256(_mm256_castsi128_si256(q0), q1, 1);
    _mm256_storeu_si256((__m256i *)offq, _mm256_xor_si256(q, _mm256_set1_epi8((char)0x80)));  /* + 128 */
    const __m512i evens = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i odds = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    _mm_storeu_si128((__m128i *)swapped, _mm512_cvtepi32_epi8(_mm512_permutex2var_epi32(lo, evens, hi)));
    _mm_storeu_si128((__m128i *)(swapped + LANES), _mm512_cvtepi32_epi8(_mm512_permutex2var_epi32(lo, odds, hi)));
    __m512 x0 = _mm512_loadu_ps(xc), x1 = _mm512_loadu_ps(xc + LANES);
    _mm512_storeu_ps(fswapped, _mm512_permutex2var_ps(x0, evens, x1));
    _mm512_storeu_ps(fswapped + LANES, _mm512_permutex2var_ps(x0, odds, x1));
    return _mm512_reduce_add_epi32(_mm512_add_epi32(lo, hi));
#elif AVX2
    const __m256 scale = _mm256_set1_ps(inv);
    __m256 xs[4];
    __m256i q[4];
    for (int i = 0; i < 4; i++) {
        xs[i] = _mm256_loadu_ps(xc + 8 * i);
        q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(xs[i], scale));  /* nearest, ties even (as lrintf) */
    }
    /* packs work within 128-bit halves: the dwords come out as a0-3 b0-3 c0-3 d0-3 a4-7 b4-7 c4-7 d4-7 */
    __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));  /* columns in order */
    _mm256_storeu_si256((__m256i *)offq, _mm256_xor_si256(bytes, _mm256_set1_epi8((char)0x80)));  /* + 128 */
    const __m256i parity = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                            0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    const __m256i split = _mm256_shuffle_epi8(bytes, parity);  /* quads: evens 0-14, odds 1-15, evens 16-30, ... */
    _mm256_storeu_si256((__m256i *)swapped, _mm256_permute4x64_epi64(split, _MM_SHUFFLE(3, 1, 2, 0)));
    for (int half = 0; half < 2; half++) {  /* x's even columns of 16 at a time, then its odd ones */
        const __m256 a = xs[2 * half], b = xs[2 * half + 1];
        const __m256 even = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
        const __m256 odd = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
        _mm256_storeu_ps(fswapped + 8 * half, (__m256)_mm256_permute4x64_epi64((__m256i)even, _MM_SHUFFLE(3, 1, 2, 0)));
        _mm256_storeu_ps(fswapped + LANES + 8 * half,
                         (__m256)_mm256_permute4x64_epi64((__m256i)odd, _MM_SHUFFLE(3, 1, 2, 0)));
    }
    const __m256i total = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, _MM_SHUFFLE(1, 0, 3, 2)));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(t);
#else
    int32_t total = 0;
    for (int j = 0; j < BLOCK; j++) {
        int q = (int)lrintf(xc[j] * inv);
        total += q;
        offq[j] = (uint8_t)(q + 128);
        swapped[(j % 2) * (BLOCK / 2) + j / 2] = (int8_t)q;
        fswapped[(j % 2) * (BLOCK / 2) + j / 2] = xc[j];
    }
    return total;
#endif
}

/* A block of 32 values' int8 step d = max|x| / 127 (into *d), and 127 / max, what x is scaled by (0 for zeros). */
static inline float block_scale(const float *xc, float *d) {
    float top = 0.0f;
#if AVX2
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 most = _mm256_setzero_ps();  /* max(a, most): most where a is NaN, as the loop below */
    for (int j = 0; j < BLOCK; j += 8) most = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(xc + j), magnitude), most);
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(most), _mm256_extractf128_ps(most, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    top = _mm_cvtss_f32(_mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1)));
#else
    for (int j = 0; j < BLOCK; j++) {  /* (not fmaxf: a call into libm per value where the CPU lacks AVX-512) */
        const float a = fabsf(xc[j]);
        top = a > top ? a : top;
    }
#endif
    *d = top / 127.0f;
    return top > 0.0f ? 127.0f / top : 0.0f;
}

/* Block c of vector b rounded to int8 on the step d (round_block, x scaled by inv = 1 / d), d and d sum(xq_c)
   stored. */
static inline void round_on(Input *in, int b, int64_t c, const float *xc, float inv, float d) {
    const int32_t levels = round_block(in, b, c, xc, inv);
    float *scales = in->scales + b * (in->stride / 64 * LANES);
    for (int j = 0; j < LANES / 2; j++) scales[(c / 2) * LANES + (c % 2) * (LANES / 2) + j] = d;
    in->sums[b * (in->stride / BLOCK) + c] = d * (float)levels;
}

/* The second rounding of x (Mat.slices 2): what the first missed, r = x - d xq (|r| <= d / 2), rounded on the step
   d' = d / FINER, so |xq'| <= 127 and x ~ d' (FINER xq + xq'), one 16-bit integer (|.| <= 32385) a value. */
#define FINER 254

/* Block c of vector b's two roundings as those 16-bit integers FINER xq + xq', in column order (Input.x16) and in
   the 4-bit order (Input.x16s), from the int8 blocks of vector b and b + Input.second. */
static inline void combine_block(Input *in, int b, int64_t c) {
    const int64_t at = b * in->stride + c * BLOCK, twin = at + in->second * in->stride;
    for (int j = 0; j < BLOCK; j++) {
        in->x16[at + j] = (int16_t)(FINER * ((int)in->offq[at + j] - 128) + ((int)in->offq[twin + j] - 128));
        in->x16s[at + j] = (int16_t)(FINER * in->swapped[at + j] + in->swapped[twin + j]);
    }
}

/* The input from vector b0 on (its second roundings, Input.second further, from b0 on too). */
static Input from(const Input *in, int b0) {
    Input part = *in;
    part.x += b0 * in->ldx, part.offq += b0 * in->stride, part.swapped += b0 * in->stride;
    part.fswapped += b0 * in->stride;
    part.scales += b0 * (in->stride / 64 * LANES);
    part.sums += b0 * (in->stride / BLOCK), part.xh += b0 * in->stride;
    part.x16 += b0 * in->stride, part.x16s += b0 * in->stride;
    return part;
}

/* What a product reads of its input besides x (prepare_blocks): nothing, x in bfloat16, that and the int8
   blocks and the 4-bit order, or those and the same of what the int8 blocks missed (Mat.slices 2). */
enum { PREPARE_NONE = 0, PREPARE_BF16 = 1, PREPARE_ALL = 2, PREPARE_TWO = 3 };

/* Whether m is MAT_I8 multiplied with x in bfloat16 (row_i8h; else rows_i8f, x in float32). */
static int int8_rows_in_bf16(const Mat *m) { return I8_BF16 && m->kind == MAT_I8 && m->k % BLOCK == 0 && int8_bf16(); }

static int prepares(const Mat *m) {
    if (!m || m->n == 0) return PREPARE_NONE;
    if ((m->kind == MAT_I8A8 || m->kind == MAT_I4) && m->slices == 2) return PREPARE_TWO;
    if (m->kind == MAT_I8A8 || m->kind == MAT_I4 || m->kind == MAT_I4F) return PREPARE_ALL;
    return int8_rows_in_bf16(m) ? PREPARE_BF16 : PREPARE_NONE;
}

/* Blocks c0 .. c1-1 of vector b (k values, k a multiple of 32; blocks past k are zeros) in bfloat16 (int8_bf16()),
   and with PREPARE_ALL rounded to int8: their parts of in->offq, swapped, scales and sums. c0 even: a
   pair of blocks shares a vector of scales. */
static void prepare_blocks(Input *in, int b, int64_t k, int64_t c0, int64_t c1, int what) {
    const float *x = in->x + b * in->ldx;
    static const float zeros[BLOCK];
    for (int64_t c = c0; c < c1 && what != PREPARE_NONE; c++) {
        const float *xc = c * BLOCK < k ? x + c * BLOCK : zeros;
#if I8_BF16
        if (int8_bf16()) {
            __m512 x0 = _mm512_loadu_ps(xc), x1 = _mm512_loadu_ps(xc + LANES);
            _mm512_storeu_si512((void *)(in->xh + b * in->stride + c * BLOCK), (__m512i)_mm512_cvtne2ps_pbh(x1, x0));
        }
#endif
        if (what < PREPARE_ALL) continue;
        float d;
        const float inv = block_scale(xc, &d);
        round_on(in, b, c, xc, inv, d);
        if (what == PREPARE_TWO) {  /* the second rounding: of x - d xq, into vector b + second */
            const uint8_t *offq = in->offq + b * in->stride + c * BLOCK;
            float missed[BLOCK];
            for (int j = 0; j < BLOCK; j++) missed[j] = xc[j] - (float)((int)offq[j] - 128) * d;
            round_on(in, b + in->second, c, missed, inv * (float)FINER, d / (float)FINER);
            combine_block(in, b, c);
        }
    }
}

/* All of vector b's blocks (to the end of the stride). */
static void prepare_input(Input *in, int b, int64_t k, int what) { prepare_blocks(in, b, k, 0, in->stride / BLOCK, what); }
