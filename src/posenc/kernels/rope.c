/* RoPE on CPU in one pass: each row of x is read once, rotated in registers and written once; and the float32
 * cos/sin tables it reads, built in one float64 pass (posenc_rope_table, below).
 *
 * Built and called by posenc/kernels/native.py (system C compiler, ctypes); see that file for the contract.
 * Paper: Su et al. 2021, "RoFormer" (arXiv:2104.09864).
 *
 * x and out are viewed as rows of D channels (the last dim, stride 1) over `ndim` leading dims with
 * per-array element strides; cos and sin share one set of strides (0 where a table is broadcast), last dim
 * stride 1, F entries per row. Pairs (a, b) are (i, i + F) for layout half and (2i, 2i + 1) for interleaved:
 *     half:         out_a = fma(-b, sin, a cos),   out_b = fma(a, sin, b cos)
 *     interleaved:  out_a = a cos - b sin,         out_b = b cos + a sin
 * computed in float (double for float64) and rounded to T once. out may be x itself (in place): every pair is
 * read before it is written, and pairs never overlap. Channels past 2F are copied when copy_rest is set.
 *
 * Build with -ffp-contract=off: exactly these roundings, which are those of the blocked torch path in
 * posenc/kernels/cpu.py (half: mul then addcmul, a fused multiply-add; interleaved: one complex multiply, no
 * fusion), so results are bit-equal with or without this kernel.
 *
 * Rows: one function per (dtype, layout) rotates one row. The portable ones are plain loops the compiler
 * vectorises for the build's target; on x86-64 CPUs with AVX-512 (found at run time with cpuid, so a generic
 * build has them too) float32 and bfloat16 rows use AVX-512 intrinsics: the same operations lane by lane, so the
 * same bits. bfloat16 is widened by moving each 16-bit word into the high half of a 32-bit lane (one vpermw, or
 * a shift for interleaved pairs) and rounded to nearest even either with integer arithmetic (as bf16_store) or,
 * with AVX512-BF16, by vcvtne2ps2bf16 (32 at once), whose results equal bf16_store's except for NaN (any NaN here,
 * 0x7FC0 in bf16_store) and float32 subnormals (flushed to zero): vectors holding those are redone with the integer
 * rounding. `simd` in the arguments caps the level (tests compare every level with the portable rows). x rows are
 * prefetched a few rows ahead: the hardware prefetchers lose their streams at every page fault and every jump to
 * the next head of a block.
 *
 * Order: rows are visited in blocks of `block` consecutive positions (the innermost leading dim): every head of
 * one block, then the next block, so a block's cos/sin rows are read from memory once and then from cache for
 * the other heads (native.py sizes blocks from the L2 cache; block 0 or >= the positions: plain row order).
 *
 * Fresh outputs: see populate_run.
 *
 * Threads: built with -fopenmp and linked to the OpenMP runtime torch itself loaded, rows are split over
 * torch's own thread pool (torch.set_num_threads applies) in chunks handed out on demand, so a thread the OS
 * preempts (a shared machine) delays one chunk, not its whole share; built without, one thread. Every row depends
 * on its own inputs only, so the split never changes a bit.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef __linux__
#include <errno.h>
#include <sys/mman.h>
#include <unistd.h>
#endif

typedef int64_t i64;
#define MAX_DIMS 16

/* Mirrored by native.py's RopeArgs (ctypes.Structure): change both, and ABI, together. */
typedef struct {
    const void *x;
    void *out;
    const void *cos, *sin;
    i64 ndim;
    i64 shape[MAX_DIMS];      /* the leading dims of x (all but the channels) */
    i64 x_strides[MAX_DIMS];  /* in elements */
    i64 out_strides[MAX_DIMS];
    i64 t_strides[MAX_DIMS];  /* of cos and sin, 0 where broadcast */
    i64 d, f;                 /* channels per row; rotated pairs per row (2F <= D) */
    i64 interleaved, copy_rest;
    i64 rows;                 /* product of shape */
    i64 grain;                /* fewest rows worth a thread of their own */
    i64 block;                /* positions (innermost leading dim) per block; 0: no blocking */
    i64 simd;                 /* highest row level allowed: 0 portable, 1 AVX-512, 2 AVX-512 + BF16 (capped) */
    i64 populate;             /* fault in fresh pages of out a run at a time (Linux; see populate_run) */
} rope_args;

static inline float bf16_load(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t bf16_store(float f) { /* round to nearest even, as torch does; NaN -> 0x7FC0 */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    return (f != f) ? (uint16_t)0x7FC0u : (uint16_t)rounded;
}

#define IDENTITY(v) (v)
#define TO_FLOAT(v) ((float)(v))
#define TO_HALF(v) ((_Float16)(v))

/* One row: x, out (T), cos, sin (C), F pairs. */
typedef void (*row_fn)(const void *x, void *out, const void *cos, const void *sin, i64 f);

/* The portable rows for storage type T and compute type C (the tables' type). */
#define PORTABLE_ROWS(NAME, T, C, FMA, LOAD, STORE)                                                             \
    static void NAME##_half(const void *xv, void *ov, const void *cv, const void *sv, i64 f) {                 \
        const T *x = (const T *)xv;                                                                            \
        T *o = (T *)ov;                                                                                        \
        const C *c = (const C *)cv, *s = (const C *)sv;                                                        \
        _Pragma("omp simd") for (i64 i = 0; i < f; i++) {                                                      \
            C p = LOAD(x[i]), q = LOAD(x[i + f]);                                                              \
            o[i] = STORE(FMA(-q, s[i], p * c[i]));                                                             \
            o[i + f] = STORE(FMA(p, s[i], q * c[i]));                                                          \
        }                                                                                                      \
    }                                                                                                          \
    static void NAME##_interleaved(const void *xv, void *ov, const void *cv, const void *sv, i64 f) {          \
        const T *x = (const T *)xv;                                                                            \
        T *o = (T *)ov;                                                                                        \
        const C *c = (const C *)cv, *s = (const C *)sv;                                                        \
        _Pragma("omp simd") for (i64 i = 0; i < f; i++) {                                                      \
            C p = LOAD(x[2 * i]), q = LOAD(x[2 * i + 1]);                                                      \
            o[2 * i] = STORE(p * c[i] - q * s[i]);                                                             \
            o[2 * i + 1] = STORE(q * c[i] + p * s[i]);                                                         \
        }                                                                                                      \
    }

PORTABLE_ROWS(float32, float, float, fmaf, IDENTITY, IDENTITY)
PORTABLE_ROWS(float64, double, double, fma, IDENTITY, IDENTITY)
PORTABLE_ROWS(bfloat16, uint16_t, float, fmaf, bf16_load, bf16_store)
#ifdef __FLT16_MAX__ /* compilers with _Float16 (GCC >= 12, clang) also get float16 */
PORTABLE_ROWS(float16, _Float16, float, fmaf, TO_FLOAT, TO_HALF)
#endif

/* ---- AVX-512 rows (x86-64, GCC >= 10 or clang >= 9: target attributes and the AVX512-BF16 intrinsics) ---- */
#if defined(__x86_64__) && (defined(__clang__) ? __clang_major__ >= 9 : (defined(__GNUC__) && __GNUC__ >= 10))
#define POSENC_AVX512 1
#include <cpuid.h>
#include <immintrin.h>

#define TARGET_512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))
#define TARGET_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")))

/* 0: none; 1: AVX-512 F/BW/VL/DQ with FMA, and the OS saves zmm state; 2: and AVX512-BF16. */
static int cpu_simd_level(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27)) || !(c & (1u << 12))) return 0; /* OSXSAVE, FMA */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 0xE6u) != 0xE6u) return 0; /* xmm, ymm, opmask, zmm0-15 upper halves, zmm16-31 */
    if (__get_cpuid_max(0, 0) < 7) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    const unsigned need = (1u << 16) | (1u << 17) | (1u << 30) | (1u << 31); /* F, DQ, BW, VL */
    if ((b & need) != need) return 0;
    __cpuid_count(7, 1, a, b, c, d);
    return (a & (1u << 5)) ? 2 : 1; /* AVX512_BF16 */
}

static inline TARGET_512 __mmask16 lanes16(i64 left) {
    return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
}

/* 16 bfloat16 widened to float32: one word permute puts word j in the high half of 32-bit lane j, zeroing the low
 * halves (a zero-extend then a shift would take two instructions). */
static inline TARGET_512 __m512 bf16x16_load(const uint16_t *p, __mmask16 m) {
    const __m512i high = _mm512_set_epi16(15, 0, 14, 0, 13, 0, 12, 0, 11, 0, 10, 0, 9, 0, 8, 0, 7, 0, 6, 0, 5, 0, 4, 0,
                                          3, 0, 2, 0, 1, 0, 0, 0);
    const __m512i w = _mm512_castsi256_si512(_mm256_maskz_loadu_epi16(m, p));
    return _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16((__mmask32)0xAAAAAAAAu, high, w));
}

/* bf16_store on 16 lanes, each result in the low half of its 32-bit lane. */
static inline TARGET_512 __m512i bf16x16_round_int(__m512 v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb), 16);
    return _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), r, _mm512_set1_epi32(0x7FC0));
}

/* NaN (quiet 0x01, signalling 0x80) or subnormal (0x20): the lanes vcvtneps2bf16 rounds unlike bf16_store. */
#define ODD_LANES 0xA1

static inline TARGET_512 __m256i bf16x16_round_soft(__m512 v) { return _mm512_cvtepi32_epi16(bf16x16_round_int(v)); }

/* Half layout, 16 pairs a step (masked at the end of the row). */
#define BF16_HALF(NAME, TARGET, ROUND)                                                                          \
    static TARGET void NAME(const void *xv, void *ov, const void *cv, const void *sv, i64 f) {                 \
        const uint16_t *x = (const uint16_t *)xv;                                                              \
        uint16_t *o = (uint16_t *)ov;                                                                          \
        const float *c = (const float *)cv, *s = (const float *)sv;                                            \
        for (i64 i = 0; i < f; i += 16) {                                                                      \
            const __mmask16 m = lanes16(f - i);                                                                \
            const __m512 a = bf16x16_load(x + i, m), b = bf16x16_load(x + i + f, m);                           \
            const __m512 cc = _mm512_maskz_loadu_ps(m, c + i), ss = _mm512_maskz_loadu_ps(m, s + i);           \
            const __m512 ra = _mm512_fnmadd_ps(b, ss, _mm512_mul_ps(a, cc));  /* fma(-b, s, a c) */           \
            const __m512 rb = _mm512_fmadd_ps(a, ss, _mm512_mul_ps(b, cc));   /* fma(a, s, b c) */            \
            _mm256_mask_storeu_epi16(o + i, m, ROUND(ra));                                                     \
            _mm256_mask_storeu_epi16(o + i + f, m, ROUND(rb));                                                 \
        }                                                                                                      \
    }
BF16_HALF(bfloat16_half_avx512, TARGET_512, bf16x16_round_soft)

/* 32 results rounded at once (vcvtne2ps2bf16: lo's in words 0-15, hi's in 16-31), odd lanes redone. */
static inline TARGET_BF16 __m512i bf16x32_round_hw(__m512 lo, __m512 hi) {
    if (_mm512_fpclass_ps_mask(lo, ODD_LANES) | _mm512_fpclass_ps_mask(hi, ODD_LANES))
        return _mm512_inserti64x4(_mm512_castsi256_si512(bf16x16_round_soft(lo)), bf16x16_round_soft(hi), 1);
    return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

static TARGET_BF16 void bfloat16_half_avx512bf16(const void *xv, void *ov, const void *cv, const void *sv, i64 f) {
    const uint16_t *x = (const uint16_t *)xv;
    uint16_t *o = (uint16_t *)ov;
    const float *c = (const float *)cv, *s = (const float *)sv;
    for (i64 i = 0; i < f; i += 32) {
        const __mmask16 m0 = lanes16(f - i), m1 = f - i > 16 ? lanes16(f - i - 16) : 0;
        const __mmask32 m = (__mmask32)m0 | ((__mmask32)m1 << 16);
        const __m512 a0 = bf16x16_load(x + i, m0), b0 = bf16x16_load(x + i + f, m0);
        const __m512 a1 = bf16x16_load(x + i + 16, m1), b1 = bf16x16_load(x + i + 16 + f, m1);
        const __m512 c0 = _mm512_maskz_loadu_ps(m0, c + i), s0 = _mm512_maskz_loadu_ps(m0, s + i);
        const __m512 c1 = _mm512_maskz_loadu_ps(m1, c + i + 16), s1 = _mm512_maskz_loadu_ps(m1, s + i + 16);
        const __m512 ra0 = _mm512_fnmadd_ps(b0, s0, _mm512_mul_ps(a0, c0)), rb0 = _mm512_fmadd_ps(a0, s0, _mm512_mul_ps(b0, c0));
        const __m512 ra1 = _mm512_fnmadd_ps(b1, s1, _mm512_mul_ps(a1, c1)), rb1 = _mm512_fmadd_ps(a1, s1, _mm512_mul_ps(b1, c1));
        _mm512_mask_storeu_epi16(o + i, m, bf16x32_round_hw(ra0, ra1));
        _mm512_mask_storeu_epi16(o + i + f, m, bf16x32_round_hw(rb0, rb1));
    }
}

/* Interleaved layout: 16 pairs = 16 32-bit words a step; a is the low half of each word, b the high half. */
static inline TARGET_512 void bf16_pairs(const uint16_t *x, __mmask16 m, __m512 *a, __m512 *b) {
    const __m512i w = _mm512_maskz_loadu_epi32(m, x);
    *a = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
    *b = _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32((int)0xFFFF0000u)));
}

static inline TARGET_512 void rotate_interleaved16(__m512 a, __m512 b, const float *c, const float *s, __mmask16 m,
                                                   __m512 *ra, __m512 *rb) {
    const __m512 cc = _mm512_maskz_loadu_ps(m, c), ss = _mm512_maskz_loadu_ps(m, s);
    *ra = _mm512_sub_ps(_mm512_mul_ps(a, cc), _mm512_mul_ps(b, ss)); /* a c - b s, unfused */
    *rb = _mm512_add_ps(_mm512_mul_ps(b, cc), _mm512_mul_ps(a, ss)); /* b c + a s */
}

static inline TARGET_512 __m512i bf16_join_soft(__m512 ra, __m512 rb) {
    return _mm512_or_si512(bf16x16_round_int(ra), _mm512_slli_epi32(bf16x16_round_int(rb), 16));
}

static TARGET_512 void bfloat16_interleaved_avx512(const void *xv, void *ov, const void *cv, const void *sv, i64 f) {
    const uint16_t *x = (const uint16_t *)xv;
    uint16_t *o = (uint16_t *)ov;
    const float *c = (const float *)cv, *s = (const float *)sv;
    for (i64 i = 0; i < f; i += 16) {
        const __mmask16 m = lanes16(f - i);
        __m512 a, b, ra, rb;
        bf16_pairs(x + 2 * i, m, &a, &b);
        rotate_interleaved16(a, b, c + i, s + i, m, &ra, &rb);
        _mm512_mask_storeu_epi32(o + 2 * i, m, bf16_join_soft(ra, rb));
    }
}

static TARGET_BF16 void bfloat16_interleaved_avx512bf16(const void *xv, void *ov, const void *cv, const void *sv,
                                                        i64 f) {
    const uint16_t *x = (const uint16_t *)xv;
    uint16_t *o = (uint16_t *)ov;
    const float *c = (const float *)cv, *s = (const float *)sv;
    /* vcvtne2ps2bf16 puts ra's 16 results in words 0-15 and rb's in 16-31; this index interleaves them. */
    const __m512i zip = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                         21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    for (i64 i = 0; i < f; i += 16) {
        const __mmask16 m = lanes16(f - i);
        __m512 a, b, ra, rb;
        bf16_pairs(x + 2 * i, m, &a, &b);
        rotate_interleaved16(a, b, c + i, s + i, m, &ra, &rb);
        __m512i w;
        if (_mm512_fpclass_ps_mask(ra, ODD_LANES) | _mm512_fpclass_ps_mask(rb, ODD_LANES))
            w = bf16_join_soft(ra, rb);
        else
            w = _mm512_permutexvar_epi16(zip, (__m512i)_mm512_cvtne2ps_pbh(rb, ra));
        _mm512_mask_storeu_epi32(o + 2 * i, m, w);
    }
}

static TARGET_512 void float32_half_avx512(const void *xv, void *ov, const void *cv, const void *sv, i64 f) {
    const float *x = (const float *)xv, *c = (const float *)cv, *s = (const float *)sv;
    float *o = (float *)ov;
    for (i64 i = 0; i < f; i += 16) {
        const __mmask16 m = lanes16(f - i);
        const __m512 a = _mm512_maskz_loadu_ps(m, x + i), b = _mm512_maskz_loadu_ps(m, x + i + f);
        const __m512 cc = _mm512_maskz_loadu_ps(m, c + i), ss = _mm512_maskz_loadu_ps(m, s + i);
        _mm512_mask_storeu_ps(o + i, m, _mm512_fnmadd_ps(b, ss, _mm512_mul_ps(a, cc)));
        _mm512_mask_storeu_ps(o + i + f, m, _mm512_fmadd_ps(a, ss, _mm512_mul_ps(b, cc)));
    }
}

static TARGET_512 void float32_interleaved_avx512(const void *xv, void *ov, const void *cv, const void *sv, i64 f) {
    const float *x = (const float *)xv, *c = (const float *)cv, *s = (const float *)sv;
    float *o = (float *)ov;
    /* 8 pairs a step: (a, b) in even and odd lanes; cos and sin each loaded once and spread to both lanes. */
    const __m512i spread = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    for (i64 i = 0; i < f; i += 8) {
        const i64 left = f - i;
        const __mmask8 m8 = left >= 8 ? (__mmask8)0xFF : (__mmask8)((1u << left) - 1u);
        const __mmask16 m = left >= 8 ? (__mmask16)0xFFFF : (__mmask16)((1u << (2 * left)) - 1u);
        const __m512 v = _mm512_maskz_loadu_ps(m, x + 2 * i);
        const __m512 swapped = _mm512_permute_ps(v, 0xB1); /* (b, a) */
        const __m512 cc = _mm512_permutexvar_ps(spread, _mm512_castps256_ps512(_mm256_maskz_loadu_ps(m8, c + i)));
        const __m512 ss = _mm512_permutexvar_ps(spread, _mm512_castps256_ps512(_mm256_maskz_loadu_ps(m8, s + i)));
        /* even lanes a c - b s, odd lanes b c + a s: the products in the portable row's operand order */
        const __m512 p1 = _mm512_mul_ps(v, cc), p2 = _mm512_mul_ps(swapped, ss);
        _mm512_mask_storeu_ps(o + 2 * i, m, _mm512_mask_add_ps(_mm512_sub_ps(p1, p2), 0xAAAA, p1, p2));
    }
}
#endif /* POSENC_AVX512 */

static int simd_level(void) {
#ifdef POSENC_AVX512
    static int level = -1; /* benign race: every thread computes the same value */
    if (level < 0) level = cpu_simd_level();
    return level;
#else
    return 0;
#endif
}

/* The row function for dtype `name`'s element size and layout, at the highest level <= cap this CPU has. */
static row_fn pick_row(int dtype, int interleaved, i64 cap) {
    const int level = (int)(cap < simd_level() ? cap : simd_level());
    switch (dtype) {
    case 0: /* float32 */
#ifdef POSENC_AVX512
        if (level >= 1) return interleaved ? float32_interleaved_avx512 : float32_half_avx512;
#endif
        return interleaved ? float32_interleaved : float32_half;
    case 1: /* float64 */
        return interleaved ? float64_interleaved : float64_half;
    case 2: /* bfloat16 */
#ifdef POSENC_AVX512
        if (level >= 2) return interleaved ? bfloat16_interleaved_avx512bf16 : bfloat16_half_avx512bf16;
        if (level >= 1) return interleaved ? bfloat16_interleaved_avx512 : bfloat16_half_avx512;
#endif
        return interleaved ? bfloat16_interleaved : bfloat16_half;
#ifdef __FLT16_MAX__
    case 3: /* float16 */
        return interleaved ? float16_interleaved : float16_half;
#endif
    default:
        return 0;
    }
}

typedef struct {
    const rope_args *a;
    row_fn row;
    i64 size, table_size; /* bytes of one element of x, of the tables */
} rope_call;

static inline i64 min64(i64 a, i64 b) { return a < b ? a : b; }

/* Fresh outputs: a new tensor of more than glibc's mmap threshold is memory the OS has not handed out yet, and the
 * first store to each 4 KiB page traps into the kernel, which zeroes the page. On the VMs measured in BENCHMARKS.md
 * those traps were most of an out-of-place call's time, and they land between the row loads and the rotation.
 * Asking for a whole run of rows at once (madvise MADV_POPULATE_WRITE, Linux 5.14) makes the same pages without a
 * trap per page, just before the run writes them (so the zeroed lines are still in cache). Only where a page
 * inside the run is not yet there (mincore): a recycled buffer costs one mincore per run, nothing more. Contents are
 * never changed; any error just leaves the pages to the ordinary faults. */
#define POPULATE_MIN_BYTES (64 << 10) /* shorter runs: the two system calls cost more than the traps they save */
static void populate_run(const char *first, const char *end) {
#ifdef __linux__
    static int off = 0; /* set once the kernel refuses MADV_POPULATE_WRITE (before 5.14), read racily: harmless */
    static long page = 0;
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
    if (__atomic_load_n(&off, __ATOMIC_RELAXED)) return;
    if (!page) page = sysconf(_SC_PAGESIZE) > 0 ? sysconf(_SC_PAGESIZE) : 4096;
    char *start = (char *)((uintptr_t)first & ~(uintptr_t)(page - 1));
    if (end - start < POPULATE_MIN_BYTES) return;
    /* A page in the middle: the run's first and last pages may hold rows of its neighbours, done already. */
    char *middle = (char *)((uintptr_t)(start + (end - start) / 2) & ~(uintptr_t)(page - 1));
    unsigned char resident = 1;
    if (mincore(middle, 1, &resident) != 0 || (resident & 1)) return;
    if (madvise(start, (size_t)(end - start), MADV_POPULATE_WRITE) != 0 && errno == EINVAL)
        __atomic_store_n(&off, 1, __ATOMIC_RELAXED);
#else
    (void)first;
    (void)end;
#endif
}

#define PREFETCH_ROWS 4 /* rows ahead whose x is prefetched (Xeon, warm outputs: 2, 4, 8 alike; none 13-17% slower) */

/* Rows [row0, row1) of the visiting order: position blocks outermost, then the other leading dims, then the
 * positions of the block (one run: the multi-index carry and the pointer set-up happen once per run). */
static void rope_rows(const void *call, i64 row0, i64 row1) {
    const rope_call *k = (const rope_call *)call;
    const rope_args *a = k->a;
    const char *x = (const char *)a->x, *cos = (const char *)a->cos, *sin = (const char *)a->sin;
    char *out = (char *)a->out;
    const i64 last = a->ndim - 1, f = a->f, tail = a->copy_rest ? a->d - 2 * a->f : 0;
    const i64 n = a->shape[last], block = a->block > 0 && a->block < n ? a->block : n, outer = a->rows / n;
    const i64 xs = a->x_strides[last] * k->size, os = a->out_strides[last] * k->size;
    const i64 ts = a->t_strides[last] * k->table_size;
    i64 b = row0 / (outer * block), rest = row0 - b * outer * block; /* the block of row0, */
    i64 len = min64(block, n - b * block), o = rest / len, i = rest - o * len; /* its outer index and position */
    i64 idx[MAX_DIMS], ox = 0, oo = 0, ot = 0;
    for (i64 d = last - 1; d >= 0; d--) { /* the multi-index of the outer index, then offsets in elements */
        idx[d] = o % a->shape[d];
        o /= a->shape[d];
        ox += idx[d] * a->x_strides[d];
        oo += idx[d] * a->out_strides[d];
        ot += idx[d] * a->t_strides[d];
    }
    for (i64 r = row0; r < row1;) {
        const i64 run = min64(len - i, row1 - r), p = b * block + i;
        const char *xr = x + ox * k->size + p * xs, *c = cos + ot * k->table_size + p * ts;
        const char *s = sin + ot * k->table_size + p * ts;
        char *orow = out + oo * k->size + p * os;
        if (a->populate && out != x) populate_run(orow, orow + (run - 1) * os + a->d * k->size);
        for (i64 m = 0; m < run; m++, xr += xs, orow += os, c += ts, s += ts) {
            if (m + PREFETCH_ROWS < run)
                for (i64 l = 0; l < a->d * k->size; l += 64) __builtin_prefetch(xr + PREFETCH_ROWS * xs + l, 0, 3);
            k->row(xr, orow, c, s, f);
            if (tail > 0) memcpy(orow + 2 * f * k->size, xr + 2 * f * k->size, (size_t)(tail * k->size));
        }
        r += run;
        i += run;
        if (i < len) continue;
        i = 0;
        i64 d = last - 1;
        for (; d >= 0; d--) { /* the next outer index, carrying leftwards */
            idx[d]++;
            ox += a->x_strides[d];
            oo += a->out_strides[d];
            ot += a->t_strides[d];
            if (idx[d] < a->shape[d]) break;
            ox -= a->shape[d] * a->x_strides[d];
            oo -= a->shape[d] * a->out_strides[d];
            ot -= a->shape[d] * a->t_strides[d];
            idx[d] = 0;
        }
        if (d < 0) { /* every outer index done: the next block */
            b++;
            len = min64(block, n - b * block);
        }
    }
}

/* Split [0, count) over the caller's OpenMP pool (torch's), at most count / grain threads, in about
 * CHUNKS_PER_THREAD chunks per thread of at least `grain` each, taken in order by whichever thread is free.
 * Nested calls and builds without OpenMP run it all on this thread. */
#define CHUNKS_PER_THREAD 8
typedef void (*range_fn)(const void *args, i64 lo, i64 hi);
static void split_range(range_fn fn, const void *args, i64 count, i64 grain) {
#ifdef _OPENMP
    grain = grain > 0 ? grain : 1;
    i64 threads = count / grain, most = omp_get_max_threads();
    threads = threads < most ? threads : most;
    if (threads > 1 && !omp_in_parallel()) {
        i64 chunks = min64(threads * CHUNKS_PER_THREAD, count / grain);
        const i64 step = (count + chunks - 1) / chunks;
        i64 next = 0;
#pragma omp parallel num_threads((int)threads) shared(next)
        for (;;) {
            const i64 lo = __atomic_fetch_add(&next, step, __ATOMIC_RELAXED);
            if (lo >= count) break;
            fn(args, lo, min64(lo + step, count));
        }
        return;
    }
#endif
    (void)grain;
    fn(args, 0, count);
}

#define ROPE_ENTRY(NAME, ID, T, C)                                                                              \
    void NAME(const rope_args *a) {                                                                             \
        const rope_call call = {a, pick_row(ID, (int)a->interleaved, a->simd), (i64)sizeof(T), (i64)sizeof(C)}; \
        split_range(rope_rows, &call, a->rows, a->grain);                                                       \
    }

ROPE_ENTRY(posenc_rope_float32, 0, float, float)
ROPE_ENTRY(posenc_rope_float64, 1, double, double)
ROPE_ENTRY(posenc_rope_bfloat16, 2, uint16_t, float)
#ifdef __FLT16_MAX__
ROPE_ENTRY(posenc_rope_float16, 3, _Float16, float)
#endif

/* The highest row level this build has on this CPU: 0 portable, 1 AVX-512, 2 AVX-512 with BF16. */
int posenc_rope_simd(void) { return simd_level(); }

/* ---- cos/sin tables: cos[n, j] = factor * cos(pos[n] * inv_freq[j]), likewise sin, rounded once to float ----
 *
 * Angles are float64 products, as in posenc.functional.rope.rope_cos_sin; sin and cos are evaluated in float64
 * and only the results are rounded to float32. x = k pi/2 + r with |r| <= pi/4: Cody-Waite reduction with pi/2
 * split in two doubles, the first step exact (fma, |x| <= 2^30), then the minimax polynomials of fdlibm's
 * __kernel_sin and __kernel_cos (under 1 ulp on [-pi/4, pi/4]) and the quadrant's signs. One pass computes both,
 * branch-free, so it vectorises. Beyond 2^30, and for NaN/inf, the C library's sin and cos take over. */
typedef struct {
    const double *pos;    /* (n,) positions, float64 */
    const double *inv;    /* (f,) inverse frequencies, float64 */
    float *cos, *sin;     /* (n, f) contiguous outputs */
    i64 n, f;
    double factor;        /* attention factor, multiplied in float64 before rounding */
    i64 grain;            /* fewest positions worth a thread of their own */
} table_args;

#define ROUND_MAGIC 0x1.8p52 /* (v + M) - M rounds v to an integer for |v| < 2^51, without a libm call */
static const double TWO_OVER_PI = 6.36619772367581382433e-01;
static const double PIO2_HI = 1.57079632679489655800e+00; /* pi/2 rounded to double */
static const double PIO2_LO = 6.12323399573676603587e-17; /* pi/2 - PIO2_HI */
static const double S1 = -1.66666666666666324348e-01, S2 = 8.33333333332248946124e-03,
                    S3 = -1.98412698298579493134e-04, S4 = 2.75573137070700676789e-06,
                    S5 = -2.50507602534068634195e-08, S6 = 1.58969099521155010221e-10;
static const double C1 = 4.16666666666666019037e-02, C2 = -1.38888888888741095749e-03,
                    C3 = 2.48015872894767294178e-05, C4 = -2.75573143513906633035e-07,
                    C5 = 2.08757232129817482790e-09, C6 = -1.13596475577881948265e-11;
#define REDUCE_LIMIT 1073741824.0 /* 2^30 */

static void table_rows(const void *args, i64 n0, i64 n1) {
    const table_args *a = (const table_args *)args;
    const i64 f = a->f;
    const double factor = a->factor;
    for (i64 n = n0; n < n1; n++) {
        const double p = a->pos[n];
        float *co = a->cos + n * f, *so = a->sin + n * f;
        int large = 0;
        _Pragma("omp simd reduction(|:large)") for (i64 j = 0; j < f; j++) {
            const double x = p * a->inv[j];
            const double k = (x * TWO_OVER_PI + ROUND_MAGIC) - ROUND_MAGIC; /* nearest multiple of pi/2 */
            double r = fma(-k, PIO2_HI, x);                                  /* exact */
            r = fma(-k, PIO2_LO, r);
            const double z = r * r;
            const double s = r + (z * r) * (S1 + z * (S2 + z * (S3 + z * (S4 + z * (S5 + z * S6)))));
            const double hz = 0.5 * z, w = 1.0 - hz;
            const double c = w + (((1.0 - w) - hz) + z * (z * (C1 + z * (C2 + z * (C3 + z * (C4 + z * (C5 + z * C6)))))));
            double q = k - 4.0 * ((k * 0.25 + ROUND_MAGIC) - ROUND_MAGIC); /* k mod 4, in -2..2 */
            q = q < 0.0 ? q + 4.0 : q;
            const int odd = q == 1.0 || q == 3.0;
            const double sn = (q >= 2.0 ? -1.0 : 1.0) * (odd ? c : s);
            const double cs = (q == 1.0 || q == 2.0 ? -1.0 : 1.0) * (odd ? s : c);
            co[j] = (float)(cs * factor);
            so[j] = (float)(sn * factor);
            large |= !(fabs(x) <= REDUCE_LIMIT);
        }
        if (large) {
            for (i64 j = 0; j < f; j++) {
                const double x = p * a->inv[j];
                if (!(fabs(x) <= REDUCE_LIMIT)) {
                    co[j] = (float)(cos(x) * factor);
                    so[j] = (float)(sin(x) * factor);
                }
            }
        }
    }
}

void posenc_rope_table(const table_args *a) { split_range(table_rows, a, a->n, a->grain); }

/* The version native.py expects: bump it with any change to rope_args or the entry points. */
int posenc_rope_abi(void) { return 6; }

/* Threads a call may use: torch's OpenMP setting where built with OpenMP, else 1. */
int posenc_rope_max_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}
