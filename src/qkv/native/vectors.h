/* The 16-float vector the kernels compute with (AVX-512's width; a compiler lowers it to narrower registers
   elsewhere), and the conversions they share: int8, IEEE half and bfloat16 to and from float32. */

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__) || defined(__F16C__) || defined(__FMA__)
#include <immintrin.h>
#endif

#define LANES 16

#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
#define AVX2 1  /* 8-float registers only: products.h takes rows_avx2.h's rows */
#else
#define AVX2 0
#endif

typedef float vf __attribute__((vector_size(64)));

static inline vf load_f(const float *p) { vf v; memcpy(&v, p, sizeof v); return v; }

/* a b + c rounded once. Written out, not left to the compiler (the library is built with -ffp-contract=off):
   GCC fuses a * b + c or not by its tuning and the loop around it (SPR's "avoid FMA chains"), so one source line
   could round differently at batch 1 and batch 7, and a prompt's rows differ from the same tokens one by one. */
static inline vf fmadd(vf a, vf b, vf c) {
#if defined(__AVX512F__)
    return (vf)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__FMA__)
    __m256 x[2], y[2], z[2];
    memcpy(x, &a, sizeof a), memcpy(y, &b, sizeof b), memcpy(z, &c, sizeof c);
    for (int i = 0; i < 2; i++) z[i] = _mm256_fmadd_ps(x[i], y[i], z[i]);
    memcpy(&c, z, sizeof c);
    return c;
#else
    return a * b + c;
#endif
}

/* p = e^r for r = x - n ln 2 (ln 2 in two parts), a polynomial of degree 6: exp_lanes' (W _mm512) and exp8's (W
   _mm256); the caller multiplies by 2^n. */
#define EXP_REDUCED(W, x, n, p)                                                                                 \
    do {                                                                                                      \
        const __typeof__(x) r_ = W##_fnmadd_ps(n, W##_set1_ps(-2.12194440e-4f),                               \
                                               W##_fnmadd_ps(n, W##_set1_ps(0.693359375f), x));              \
        p = W##_set1_ps(1.0f / 720.0f);                                                                       \
        p = W##_fmadd_ps(p, r_, W##_set1_ps(1.0f / 120.0f));                                                  \
        p = W##_fmadd_ps(p, r_, W##_set1_ps(1.0f / 24.0f));                                                   \
        p = W##_fmadd_ps(p, r_, W##_set1_ps(1.0f / 6.0f));                                                    \
        p = W##_fmadd_ps(p, r_, W##_set1_ps(0.5f));                                                           \
        p = W##_fmadd_ps(p, r_, W##_set1_ps(1.0f));                                                           \
        p = W##_fmadd_ps(p, r_, W##_set1_ps(1.0f));                                                           \
    } while (0)

#if defined(__AVX512F__)
/* The lanes of a vector that hold numbers when `left` of them remain: all 16, or the first `left`. */
static inline __mmask16 lanes_left(int64_t left) {
    return left >= LANES ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
}

/* e^x for each lane: a polynomial of degree 6 on x - n ln 2 times 2^n, within 3 units in the last place of e^x
   rounded to float32 (2.3e-7 relative) for every float32 x in [-87, 0]. Lanes below -87 give e^-87 (about 1.6e-38:
   nothing beside a softmax's largest weight, 1), lanes above 88 +inf. */
static inline __m512 exp_lanes(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 p;
    EXP_REDUCED(_mm512, x, n, p);
    return _mm512_scalef_ps(p, n);
}
#endif

static inline float hsum(vf v) {
    vf t = v + __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
    t += __builtin_shufflevector(t, t, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
    t += __builtin_shufflevector(t, t, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
    return t[0] + t[1];
}

/* An IEEE half (a GGUF block's scale) as float: F16C's instruction where the CPU has it, else by its bits
   (compilers without _Float16 on this target, such as clang 14, build either). */
static inline float half_to_float(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h >> 15) << 31, exponent = (h >> 10) & 31, mantissa = h & 1023, bits;
    if (exponent == 31) bits = sign | 0x7f800000u | (mantissa << 13); /* inf, nan */
    else if (exponent) bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
    else if (!mantissa) bits = sign; /* zero */
    else { /* subnormal: normalise */
        exponent = 113;
        while (!(mantissa & 1024)) { mantissa <<= 1; exponent--; }
        bits = sign | (exponent << 23) | ((mantissa & 1023) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
#endif
}

/* x in bfloat16, rounded to nearest even, as PyTorch converts (x finite). */
static inline uint16_t bf16_bits(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    return (uint16_t)((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

#if defined(__AVX512F__)
/* 16 finite floats in bfloat16, rounded to nearest even (bf16_bits, 16 at once, without AVX512_BF16). */
static inline __m256i round_bf16(__m512 v) {
    __m512i bits = _mm512_castps_si512(v);
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    bits = _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(bits, 16));
}
#endif

#if AVX2
/* The sum of 8 floats: the upper half onto the lower, then pairs. */
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* e^x for 8 lanes, as exp_lanes (the same polynomial on x - n ln 2, times 2^n built in the exponent's bits): x in
   [-87, 0] within 3 units in the last place; below -87, e^-87; above 88, e^88 (about 1.7e38). */
static inline __m256 exp8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    x = _mm256_min_ps(x, _mm256_set1_ps(88.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 p;
    EXP_REDUCED(_mm256, x, n, p);
    /* 2^n, n in [-126, 127] (x clamped to [-87, 88]): n + 127 in the exponent's bits */
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* 8 int8 widened to float. */
static inline __m256 load_i8x8(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
#endif

/* 16 int8 widened to float: one instruction with AVX-512, two with AVX2, a loop the compiler vectorises elsewhere
   (GCC scalarises __builtin_convertvector's widening). */
static inline vf load_i8(const int8_t *p) {
#if defined(__AVX512F__)
    return (vf)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
#elif AVX2
    __m256 t[2] = {load_i8x8(p), load_i8x8(p + 8)};
    vf v;
    memcpy(&v, t, sizeof v);
    return v;
#else
    float t[LANES];
    vf v;
    for (int i = 0; i < LANES; i++) t[i] = (float)p[i];
    memcpy(&v, t, sizeof v);
    return v;
#endif
}
