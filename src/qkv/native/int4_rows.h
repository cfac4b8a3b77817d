/* Rows of 4-bit weights (MAT_I4, MAT_I4F) times B vectors, for products.h, which includes this file after its
   float and int8 rows: a row's 4-bit levels two to a byte (column 2j in byte j's low nibble, 2j + 1 in its high
   one), a float16 scale s and minimum m per group of 32 << shift columns, W = s q + m. MAT_I4 multiplies the
   levels by x rounded to int8 blocks (VNNI), MAT_I4F by x itself (products.h's header has the arithmetic). */

/* The float16 scales of blocks c and c + 1 (groups c >> shift and (c + 1) >> shift), as floats [s_c x8, s_c+1 x8]. */
#if HAVE_VNNI
static inline __m512 pair_scales(const uint16_t *s16, int64_t c, int shift, int64_t blocks) {
    const __m512i halves = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    uint32_t both = (uint32_t)s16[c >> shift] | (c + 1 < blocks ? (uint32_t)s16[(c + 1) >> shift] << 16 : 0u);
    return _mm512_permutexvar_ps(halves, _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128((int)both))));
}
#endif

INLINE void row_i4(const uint8_t *w, const uint16_t *s16, const uint16_t *m16, int64_t k, int shift,
                   const Input *in, int B, float *out) {
    const int64_t blocks = k / BLOCK;
#if HAVE_VNNI
    __m512 acc[MAX_ROWS];
    for (int b = 0; b < B; b++) acc[b] = _mm512_setzero_ps();
    /* 128-bit lanes of the 32 bytes of two blocks: [A, A, B, B]; shifting the second of each pair by 4 and
       masking leaves [low nibbles of A, high of A, low of B, high of B] = the columns [even A, odd A, ...]. */
    const __m512i shifts = _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0), nibble = _mm512_set1_epi8(15);
    for (int64_t c = 0; c < blocks; c += 2) {
        __builtin_prefetch(w + c * 16 + PREFETCH_INT4, 0, 1);
        __m256i bytes = c + 1 < blocks ? _mm256_loadu_si256((const __m256i *)(w + c * 16))
                                       : _mm256_zextsi128_si256(_mm_loadu_si128((const __m128i *)(w + c * 16)));
        __m512i raw = _mm512_castsi256_si512(bytes);
        __m512i levels = _mm512_and_si512(_mm512_srlv_epi64(_mm512_shuffle_i64x2(raw, raw, 0x50), shifts), nibble);
        __m512 s = pair_scales(s16, c, shift, blocks);
        for (int b = 0; b < B; b++) {
            __m512i x = _mm512_loadu_si512((const void *)(in->swapped + b * in->stride + c * BLOCK));
            __m512i dots = _mm512_dpbusd_epi32(_mm512_setzero_si512(), levels, x);
            __m512 d = _mm512_loadu_ps(in->scales + b * (in->stride / 64 * LANES) + c / 2 * LANES);
            acc[b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots), _mm512_mul_ps(s, d), acc[b]);
        }
    }
    for (int b = 0; b < B; b++) out[b] = _mm512_reduce_add_ps(acc[b]);
#elif AVX2
    row_i4_levels_avx2(w, s16, k, shift, in, B, out);
#else
    for (int b = 0; b < B; b++) {
        const int8_t *swapped = in->swapped + b * in->stride;
        const float *scales = in->scales + b * (in->stride / 64 * LANES);
        float total = 0.0f;
        for (int64_t c = 0; c < blocks; c++) {
            int32_t dot = 0;
            for (int j = 0; j < BLOCK / 2; j++) {
                uint8_t byte = w[c * 16 + j];
                dot += (byte & 15) * swapped[c * BLOCK + j] + (byte >> 4) * swapped[c * BLOCK + 16 + j];
            }
            total += (float)dot * scales[(c / 2) * LANES + (c % 2) * (LANES / 2)] * half_to_float(s16[c >> shift]);
        }
        out[b] = total;
    }
#endif
#if AVX2
    const int64_t done = shift == 0 ? row_i4_mins_avx2(m16, blocks, in, B, out) : 0;
#else
    const int64_t done = 0;
#endif
    for (int b = 0; b < B; b++) {  /* + sum_c m_c d_c sum(xq_c) */
        const float *sums = in->sums + b * (in->stride / BLOCK);
        float low = 0.0f;
        int64_t c = done;
#if defined(__AVX512F__)
        if (shift == 0) {
            __m512 lows = _mm512_setzero_ps();
            for (; c + LANES <= blocks; c += LANES)
                lows = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(m16 + c))),
                                       _mm512_loadu_ps(sums + c), lows);
            low = _mm512_reduce_add_ps(lows);
        }
#endif
        for (; c < blocks; c++) low += half_to_float(m16[c >> shift]) * sums[c];
        out[b] += low;
    }
}

/* MAT_I4F: the same 4-bit rows times float32 x, y = sum_j (s q_j + m) x_j, the dequantized matrix's numbers (an
   int4 file's own float32 model's) up to the order of the sums: x is not rounded. Per block of 32 it makes a vector of
   the 16 values a level stands for, s l + m for l = 0..15 (a table); each byte's two nibbles, widened to 32 bits,
   pick their weights from it (vpermps reads an index's low four bits: the low nibble as it is, the high one shifted
   down), 16 even columns and 16 odd ones, which multiply x in the same order (Input.fswapped). R rows (1, 2 or 4,
   k / 2 bytes apart) share each load of x: at batch 8 those loads bounded the product. One chain of sums per row
   and vector, evens then odds of each block, in the same order whatever R and B are: out[r * MAX_ROWS + b]. */
INLINE void rows_i4f(const uint8_t *w, const uint16_t *s16, const uint16_t *m16, int64_t k, int shift, const int R,
                     int64_t groups, const Input *in, int B, float *out) {
    const int64_t blocks = k / BLOCK;
#if defined(__AVX512BW__)
    __m512 acc[4][MAX_ROWS];
    for (int r = 0; r < R; r++)
        for (int b = 0; b < B; b++) acc[r][b] = _mm512_setzero_ps();
    const __m512 iota = _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    /* With a scale per block: the scales and minimums of 16 blocks as floats, in memory, so that each block's
       are broadcast by a load rather than by a shuffle (on Intel the shuffles and half the FMAs share one port:
       5-10% faster there, measured on Emerald Rapids) */
    float S16[4][16] __attribute__((aligned(64))), M16[4][16] __attribute__((aligned(64)));
    for (int64_t c = 0; c < blocks; c++) {
        __m512 even[4], odd[4];
        if (shift == 0 && (c & 15) == 0) {  /* (one conversion per 16 blocks: 2% faster a step than two per block) */
            const __mmask16 some = blocks - c >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (blocks - c)) - 1);
            for (int r = 0; r < R; r++) {
                _mm512_store_ps(S16[r], _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(some, s16 + r * groups + c)));
                _mm512_store_ps(M16[r], _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(some, m16 + r * groups + c)));
            }
        }
        for (int r = 0; r < R; r++) {
            const uint8_t *wr = w + r * (k / 2);
            __builtin_prefetch(wr + c * 16 + PREFETCH_INT4, 0, 1);
            __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(wr + c * 16)));
            __m512 table;
            if (shift == 0) {
                table = _mm512_fmadd_ps(iota, _mm512_set1_ps(S16[r][c & 15]), _mm512_set1_ps(M16[r][c & 15]));
            } else {
                const float s = half_to_float(s16[r * groups + (c >> shift)]), m = half_to_float(m16[r * groups + (c >> shift)]);
                table = _mm512_fmadd_ps(iota, _mm512_set1_ps(s), _mm512_set1_ps(m));
            }
            even[r] = _mm512_permutexvar_ps(v, table);
            odd[r] = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table);
        }
        for (int b = 0; b < B; b++) {
            const float *x = in->fswapped + b * in->stride + c * BLOCK;
            __m512 xe = _mm512_loadu_ps(x), xo = _mm512_loadu_ps(x + LANES);
            for (int r = 0; r < R; r++) acc[r][b] = _mm512_fmadd_ps(odd[r], xo, _mm512_fmadd_ps(even[r], xe, acc[r][b]));
        }
    }
    for (int r = 0; r < R; r++)
        for (int b = 0; b < B; b++) out[r * MAX_ROWS + b] = _mm512_reduce_add_ps(acc[r][b]);
#else
    for (int r = 0; r < R; r++)
        for (int b = 0; b < B; b++) {
            const uint8_t *wr = w + r * (k / 2);
            const float *x = in->fswapped + b * in->stride;
            float total = 0.0f;
            for (int64_t c = 0; c < blocks; c++) {
                float s = half_to_float(s16[r * groups + (c >> shift)]), m = half_to_float(m16[r * groups + (c >> shift)]);
                for (int j = 0; j < BLOCK / 2; j++) {
                    uint8_t byte = wr[c * 16 + j];
                    total += (s * (float)(byte & 15) + m) * x[c * BLOCK + j];
                    total += (s * (float)(byte >> 4) + m) * x[c * BLOCK + BLOCK / 2 + j];
                }
            }
            out[r * MAX_ROWS + b] = total;
        }
#endif
}
