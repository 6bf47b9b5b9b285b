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
 * Threads: built with -fopenmp and linked to the OpenMP runtime torch itself loaded, rows are split over
 * torch's own thread pool (torch.set_num_threads applies); built without, one thread.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
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

/* Rows [row0, row1) for storage type T, compute type C (the tables' type). Rows are walked in runs along the
 * innermost leading dim (positions, usually), so the multi-index carry runs once per run, not once per row. */
#define ROPE_ROWS(NAME, T, C, FMA, LOAD, STORE)                                                                 \
    static void NAME(const void *args, i64 row0, i64 row1) {                                                   \
        const rope_args *a = (const rope_args *)args;                                                          \
        const T *x = (const T *)a->x;                                                                          \
        T *out = (T *)a->out;                                                                                  \
        const C *cos = (const C *)a->cos, *sin = (const C *)a->sin;                                            \
        const i64 last = a->ndim - 1, f = a->f, tail = a->copy_rest ? a->d - 2 * a->f : 0;                      \
        const i64 xs = a->x_strides[last], os = a->out_strides[last], ts = a->t_strides[last];                 \
        i64 idx[MAX_DIMS];                                                                                     \
        i64 ox = 0, oo = 0, ot = 0, rest = row0;                                                               \
        for (i64 k = last; k >= 0; k--) { /* the multi-index of row0, then offsets */                         \
            idx[k] = rest % a->shape[k];                                                                       \
            rest /= a->shape[k];                                                                               \
            ox += idx[k] * a->x_strides[k];                                                                    \
            oo += idx[k] * a->out_strides[k];                                                                  \
            ot += idx[k] * a->t_strides[k];                                                                    \
        }                                                                                                      \
        for (i64 r = row0; r < row1;) {                                                                        \
            i64 run = a->shape[last] - idx[last];                                                              \
            run = run < row1 - r ? run : row1 - r;                                                             \
            const T *xr = x + ox;                                                                              \
            T *o = out + oo;                                                                                   \
            const C *c = cos + ot, *s = sin + ot;                                                              \
            for (i64 m = 0; m < run; m++, xr += xs, o += os, c += ts, s += ts) {                               \
                if (a->interleaved) {                                                                          \
                    _Pragma("omp simd") for (i64 i = 0; i < f; i++) {                                          \
                        C p = LOAD(xr[2 * i]), q = LOAD(xr[2 * i + 1]);                                        \
                        o[2 * i] = STORE(p * c[i] - q * s[i]);                                                 \
                        o[2 * i + 1] = STORE(q * c[i] + p * s[i]);                                             \
                    }                                                                                          \
                } else {                                                                                       \
                    _Pragma("omp simd") for (i64 i = 0; i < f; i++) {                                          \
                        C p = LOAD(xr[i]), q = LOAD(xr[i + f]);                                                \
                        o[i] = STORE(FMA(-q, s[i], p * c[i]));                                                 \
                        o[i + f] = STORE(FMA(p, s[i], q * c[i]));                                              \
                    }                                                                                          \
                }                                                                                              \
                if (tail > 0) memcpy(o + 2 * f, xr + 2 * f, (size_t)tail * sizeof(T));                         \
            }                                                                                                  \
            r += run;                                                                                          \
            idx[last] += run;                                                                                  \
            ox += run * xs;                                                                                    \
            oo += run * os;                                                                                    \
            ot += run * ts;                                                                                    \
            for (i64 k = last; k >= 0 && idx[k] == a->shape[k]; k--) { /* carry leftwards */                  \
                ox -= a->shape[k] * a->x_strides[k];                                                           \
                oo -= a->shape[k] * a->out_strides[k];                                                         \
                ot -= a->shape[k] * a->t_strides[k];                                                           \
                idx[k] = 0;                                                                                    \
                if (k > 0) {                                                                                   \
                    idx[k - 1]++;                                                                              \
                    ox += a->x_strides[k - 1];                                                                 \
                    oo += a->out_strides[k - 1];                                                               \
                    ot += a->t_strides[k - 1];                                                                 \
                }                                                                                              \
            }                                                                                                  \
        }                                                                                                      \
    }

/* Split [0, count) into one contiguous range per thread, at most count / grain threads, on the caller's OpenMP
 * pool (torch's); nested calls and builds without OpenMP run it all on this thread. */
typedef void (*range_fn)(const void *args, i64 lo, i64 hi);
static void split_range(range_fn fn, const void *args, i64 count, i64 grain) {
#ifdef _OPENMP
    i64 threads = count / (grain > 0 ? grain : 1), most = omp_get_max_threads();
    threads = threads < most ? threads : most;
    if (threads > 1 && !omp_in_parallel()) {
#pragma omp parallel num_threads((int)threads)
        {
            i64 nt = omp_get_num_threads(), t = omp_get_thread_num(), step = (count + nt - 1) / nt;
            i64 lo = t * step, hi = lo + step < count ? lo + step : count;
            if (lo < hi) fn(args, lo, hi);
        }
        return;
    }
#endif
    (void)grain;
    fn(args, 0, count);
}

#define ROPE_KERNEL(NAME, T, C, FMA, LOAD, STORE)               \
    ROPE_ROWS(NAME##_rows, T, C, FMA, LOAD, STORE)              \
    void NAME(const rope_args *a) { split_range(NAME##_rows, a, a->rows, a->grain); }

ROPE_KERNEL(posenc_rope_float32, float, float, fmaf, IDENTITY, IDENTITY)
ROPE_KERNEL(posenc_rope_float64, double, double, fma, IDENTITY, IDENTITY)
ROPE_KERNEL(posenc_rope_bfloat16, uint16_t, float, fmaf, bf16_load, bf16_store)
#ifdef __FLT16_MAX__ /* compilers with _Float16 (GCC >= 12, clang) also get float16 */
ROPE_KERNEL(posenc_rope_float16, _Float16, float, fmaf, TO_FLOAT, TO_HALF)
#endif

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
int posenc_rope_abi(void) { return 5; }

/* Threads a call may use: torch's OpenMP setting where built with OpenMP, else 1. */
int posenc_rope_max_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}
