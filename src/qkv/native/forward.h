/* What the PyTorch forward of the quantized layers calls on a prompt's thousands of rows, where PyTorch's
   elementwise operations would cost as much as the products: x rounded to int8 blocks (the int8-activation
   layers), and 4- and 8-bit matrices widened to float32 or bfloat16 for a GEMM. Each gives PyTorch's own numbers
   bit for bit (the tests compare), so the C library is a faster road to the same result. */

/* x (rows, k), k a multiple of 32, rounded to int8 in blocks of 32 and back: out = d_c round(x_c / d_c) with
   d_c = max|x_c| / 127, scaled by 127 / max as the step does, ties to even (activation_blocks.round_blocks: the
   PyTorch forward of the layers with int8 activations, a prompt's thousands of rows in one pass). */
/* One block of 32 values rounded to int8 levels on the step d (xc scaled by inv = 1 / d): oc = round(xc inv) d. */
static inline void round_on_step(const float *xc, float *oc, float inv, float d) {
#if defined(__AVX512F__)
    for (int j = 0; j < BLOCK; j += LANES) {
        __m512 level = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_loadu_ps(xc + j), _mm512_set1_ps(inv)),
                                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm512_storeu_ps(oc + j, _mm512_mul_ps(level, _mm512_set1_ps(d)));
    }
#else
    for (int j = 0; j < BLOCK; j++) oc[j] = nearbyintf(xc[j] * inv) * d;
#endif
}

/* One block of 32 values rounded to int8 levels times its step: oc = round(xc / d) d, d = max|xc| / 127. */
static inline void round_one_block(const float *xc, float *oc) {
    float d;
    const float inv = block_scale(xc, &d);
    round_on_step(xc, oc, inv, d);
}

void qkv_round_blocks(const float *x, int64_t rows, int64_t k, float *out, int32_t threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < k / BLOCK; c++) round_one_block(x + r * k + c * BLOCK, out + r * k + c * BLOCK);
}

/* x rounded twice (activations "int8x2"): each block rounded, what that missed (x - rounded, in float32) rounded on
   the step d / FINER (inputs.h), and the two added, the numbers of activation_blocks.round_activations in PyTorch's
   three passes. */
void qkv_round_blocks_twice(const float *x, int64_t rows, int64_t k, float *out, int32_t threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < k / BLOCK; c++) {
            const float *xc = x + r * k + c * BLOCK;
            float *oc = out + r * k + c * BLOCK, missed[BLOCK], second[BLOCK];
            float d;
            const float inv = block_scale(xc, &d);
            round_on_step(xc, oc, inv, d);
            for (int j = 0; j < BLOCK; j++) missed[j] = xc[j] - oc[j];
            round_on_step(missed, second, inv * (float)FINER, d / (float)FINER);
            for (int j = 0; j < BLOCK; j++) oc[j] += second[j];
        }
}

/* The 4-bit matrix (MAT_I4's layout: rows of k / 2 bytes, float16 s and m per group of `group` columns) widened to
   W = s q + m, rows (rows, k) into out as float32 or (bf16) bfloat16 rounded to nearest even: s q is rounded to
   float32, then + m, the two steps of int4_linear.dequantize in PyTorch, so the numbers are the same. A prompt's
   product widens every matrix this way; PyTorch's six operations per slice took a quarter of a 512-token prefill. */
void qkv_dequantize_int4(const uint8_t *w, const uint16_t *s16, const uint16_t *m16, int64_t rows, int64_t k,
                         int64_t group, void *out, int32_t bf16, int32_t threads) {
    const int64_t groups = k / group;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < rows; r++)
        for (int64_t g = 0; g < groups; g++) {
            const float s = half_to_float(s16[r * groups + g]), m = half_to_float(m16[r * groups + g]);
            const uint8_t *bytes = w + r * (k / 2) + g * (group / 2);
            const int64_t at = r * k + g * group;
            int64_t j = 0;
#if defined(__AVX512F__) && defined(__AVX512BW__)
            for (; j + BLOCK <= group; j += BLOCK) {  /* 16 bytes: [low, high] nibbles of each, in column order */
                __m256i words = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(bytes + j / 2)));
                __m256i levels = _mm256_or_si256(_mm256_and_si256(words, _mm256_set1_epi16(15)),
                                                 _mm256_and_si256(_mm256_slli_epi16(words, 4), _mm256_set1_epi16(0x0F00)));
                __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(levels)));
                __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(levels, 1)));
                lo = _mm512_add_ps(_mm512_mul_ps(lo, _mm512_set1_ps(s)), _mm512_set1_ps(m));
                hi = _mm512_add_ps(_mm512_mul_ps(hi, _mm512_set1_ps(s)), _mm512_set1_ps(m));
                if (bf16) {
                    uint16_t *o = (uint16_t *)out + at + j;
                    _mm256_storeu_si256((__m256i *)o, round_bf16(lo));
                    _mm256_storeu_si256((__m256i *)(o + LANES), round_bf16(hi));
                } else {
                    _mm512_storeu_ps((float *)out + at + j, lo);
                    _mm512_storeu_ps((float *)out + at + j + LANES, hi);
                }
            }
#elif AVX2
            for (; j + BLOCK <= group && !bf16; j += BLOCK) {  /* as above, 8 columns a register */
                __m256i words = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(bytes + j / 2)));
                __m256i levels = _mm256_or_si256(_mm256_and_si256(words, _mm256_set1_epi16(15)),
                                                 _mm256_and_si256(_mm256_slli_epi16(words, 4), _mm256_set1_epi16(0x0F00)));
                for (int part = 0; part < 4; part++) {
                    const __m128i eight = part < 2 ? _mm256_castsi256_si128(levels) : _mm256_extracti128_si256(levels, 1);
                    __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(part % 2 ? _mm_srli_si128(eight, 8) : eight));
                    _mm256_storeu_ps((float *)out + at + j + 8 * part,
                                     _mm256_add_ps(_mm256_mul_ps(v, _mm256_set1_ps(s)), _mm256_set1_ps(m)));
                }
            }
#endif
            for (; j < group; j++) {
                const float v = (float)(j % 2 ? bytes[j / 2] >> 4 : bytes[j / 2] & 15) * s + m;
                if (bf16) ((uint16_t *)out)[at + j] = bf16_bits(v);
                else ((float *)out)[at + j] = v;
            }
        }
}

/* The int8 matrix q (rows, k) in groups of `group` columns with float32 scales s (rows, k / group), widened to
   W = s q rounded to float32, into out as float32 or (bf16) bfloat16 rounded to nearest even: int8_linear.dequantize
   in PyTorch, the same numbers. */
void qkv_dequantize_int8(const int8_t *q, const float *scale, int64_t rows, int64_t k, int64_t group, void *out,
                         int32_t bf16, int32_t threads) {
    const int64_t groups = k / group;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < rows; r++)
        for (int64_t g = 0; g < groups; g++) {
            const float s = scale[r * groups + g];
            const int64_t at = r * k + g * group;
            int64_t j = 0;
#if defined(__AVX512F__)
            for (; j + LANES <= group; j += LANES) {
                __m512 v = _mm512_mul_ps(load_i8(q + at + j), _mm512_set1_ps(s));
                if (bf16) _mm256_storeu_si256((__m256i *)((uint16_t *)out + at + j), round_bf16(v));
                else _mm512_storeu_ps((float *)out + at + j, v);
            }
#elif AVX2
            for (; j + 8 <= group && !bf16; j += 8)
                _mm256_storeu_ps((float *)out + at + j, _mm256_mul_ps(load_i8x8(q + at + j), _mm256_set1_ps(s)));
#endif
            for (; j < group; j++) {
                const float v = (float)q[at + j] * s;
                if (bf16) ((uint16_t *)out)[at + j] = bf16_bits(v);
                else ((float *)out)[at + j] = v;
            }
        }
}
