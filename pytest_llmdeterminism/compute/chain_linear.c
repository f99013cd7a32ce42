/* y = x @ w.T (+ bias) for float32, with the bits of oneDNN's AVX2 GEMM (torch 2.13, oneDNN 3.12).
 *
 * Every output y[r][o] is computed in oneDNN's fixed order: the input features are cut into blocks
 * of `kblock` (1024), the blocks' sums are added left to right, then the bias. At two or more rows a
 * block is one sequential chain of fused multiply-adds from zero (k = k0, k0 + 1, ...); at one row
 * (oneDNN's one-row kernel) 8 lanes chain every 8th feature and are reduced in a fixed tree.
 * compute/chain.py checks each shape against oneDNN in the process before it uses it. A fused
 * multiply-add rounds once (IEEE 754), and each output's order does not depend on the vector width,
 * the thread count or the other rows, so the bits are the same on every x86-64 CPU with AVX2 and FMA.
 *
 * At two or more rows the vector lanes run over rows, not over input features: x is transposed into
 * `xt` (K x rows, rows padded), every lane holds one row's chain and the weight's element is
 * broadcast. The weight is read in its own layout (out x K, row-major): nothing is packed or copied.
 * Up to 8 rows (a decode step) one AVX2 register per output, 8 outputs at once; more rows two
 * registers per output: 6 outputs of 16 rows at once with AVX2, or where the CPU has AVX-512 12
 * outputs of 32 rows (the same chains, twice the lanes), the rows past the last whole block in
 * smaller ones. Threads take whole blocks of outputs.
 */
#include <immintrin.h>
#include <stdlib.h>

#define LANES 8
/* A product of fewer multiply-adds runs on the calling thread: starting a team costs more than the
 * second thread saves, and far more on a loaded machine. Each output's order does not depend on the
 * thread count, so neither do the bits. */
#define TEAM_MIN_WORK (1L << 18)

static int team(long work, int threads) {
    return work < TEAM_MIN_WORK ? 1 : threads;
}

static void block_8x1(const float *xt, int rp, int group, const float *const *w, int K, int kblock,
                      __m256 *total) {
    for (int k0 = 0; k0 < K; k0 += kblock) {
        int k1 = k0 + kblock < K ? k0 + kblock : K;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
        const float *xp = xt + (size_t)k0 * rp + group * LANES;
        for (int k = k0; k < k1; k++, xp += rp) {
            __m256 xv = _mm256_loadu_ps(xp);
            a0 = _mm256_fmadd_ps(xv, _mm256_broadcast_ss(w[0] + k), a0);
            a1 = _mm256_fmadd_ps(xv, _mm256_broadcast_ss(w[1] + k), a1);
            a2 = _mm256_fmadd_ps(xv, _mm256_broadcast_ss(w[2] + k), a2);
            a3 = _mm256_fmadd_ps(xv, _mm256_broadcast_ss(w[3] + k), a3);
            a4 = _mm256_fmadd_ps(xv, _mm256_broadcast_ss(w[4] + k), a4);
            a5 = _mm256_fmadd_ps(xv, _mm256_broadcast_ss(w[5] + k), a5);
            a6 = _mm256_fmadd_ps(xv, _mm256_broadcast_ss(w[6] + k), a6);
            a7 = _mm256_fmadd_ps(xv, _mm256_broadcast_ss(w[7] + k), a7);
        }
        __m256 a[8] = {a0, a1, a2, a3, a4, a5, a6, a7};
        for (int i = 0; i < 8; i++) total[i] = k0 == 0 ? a[i] : _mm256_add_ps(total[i], a[i]);
    }
}

static void block_6x2(const float *xt, int rp, int group, const float *const *w, int K, int kblock,
                      __m256 *total) {
    for (int k0 = 0; k0 < K; k0 += kblock) {
        int k1 = k0 + kblock < K ? k0 + kblock : K;
        __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00;
        __m256 a30 = a00, a31 = a00, a40 = a00, a41 = a00, a50 = a00, a51 = a00;
        const float *xp = xt + (size_t)k0 * rp + group * LANES;
        for (int k = k0; k < k1; k++, xp += rp) {
            __m256 x0 = _mm256_loadu_ps(xp), x1 = _mm256_loadu_ps(xp + LANES), b;
            b = _mm256_broadcast_ss(w[0] + k); a00 = _mm256_fmadd_ps(x0, b, a00); a01 = _mm256_fmadd_ps(x1, b, a01);
            b = _mm256_broadcast_ss(w[1] + k); a10 = _mm256_fmadd_ps(x0, b, a10); a11 = _mm256_fmadd_ps(x1, b, a11);
            b = _mm256_broadcast_ss(w[2] + k); a20 = _mm256_fmadd_ps(x0, b, a20); a21 = _mm256_fmadd_ps(x1, b, a21);
            b = _mm256_broadcast_ss(w[3] + k); a30 = _mm256_fmadd_ps(x0, b, a30); a31 = _mm256_fmadd_ps(x1, b, a31);
            b = _mm256_broadcast_ss(w[4] + k); a40 = _mm256_fmadd_ps(x0, b, a40); a41 = _mm256_fmadd_ps(x1, b, a41);
            b = _mm256_broadcast_ss(w[5] + k); a50 = _mm256_fmadd_ps(x0, b, a50); a51 = _mm256_fmadd_ps(x1, b, a51);
        }
        __m256 a[12] = {a00, a01, a10, a11, a20, a21, a30, a31, a40, a41, a50, a51};
        for (int i = 0; i < 12; i++) total[i] = k0 == 0 ? a[i] : _mm256_add_ps(total[i], a[i]);
    }
}

__attribute__((target("avx512f")))
static void block_12x2_avx512(const float *xt, int rp, int group, const float *const *w, int K, int kblock,
                              float *total) {
    __m512 a[24];
    for (int k0 = 0; k0 < K; k0 += kblock) {
        int k1 = k0 + kblock < K ? k0 + kblock : K;
        for (int i = 0; i < 24; i++) a[i] = _mm512_setzero_ps();
        const float *xp = xt + (size_t)k0 * rp + group * LANES;
        for (int k = k0; k < k1; k++, xp += rp) {
            __m512 x0 = _mm512_loadu_ps(xp), x1 = _mm512_loadu_ps(xp + 2 * LANES);
            for (int i = 0; i < 12; i++) {
                __m512 b = _mm512_set1_ps(w[i][k]);
                a[2 * i] = _mm512_fmadd_ps(x0, b, a[2 * i]);
                a[2 * i + 1] = _mm512_fmadd_ps(x1, b, a[2 * i + 1]);
            }
        }
        for (int i = 0; i < 24; i++) {
            __m512 sum = k0 == 0 ? a[i] : _mm512_add_ps(_mm512_loadu_ps(total + 16 * i), a[i]);
            _mm512_storeu_ps(total + 16 * i, sum);
        }
    }
}

/* One row: oneDNN's one-row kernel. Per block of input features, 8 lanes over k (lane j takes
 * k = k0 + j, k0 + j + 8, ..., a chain of fused multiply-adds), reduced as
 * ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7)); the blocks' sums added left to right. A lane past
 * the end adds 0 * 0, which leaves a chain started at +0 unchanged. 8 outputs at once. */
static float reduce8(__m256 v) {
    float l[LANES];
    _mm256_storeu_ps(l, v);
    return ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
}

static void one_row(const float *x, const float *const *w, int K, int kblock, float *sums) {
    static const int ramp[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    for (int k0 = 0; k0 < K; k0 += kblock) {
        int k1 = k0 + kblock < K ? k0 + kblock : K;
        __m256 a[8];
        for (int i = 0; i < 8; i++) a[i] = _mm256_setzero_ps();
        int k = k0;
        for (; k + LANES <= k1; k += LANES) {
            __m256 xv = _mm256_loadu_ps(x + k);
            for (int i = 0; i < 8; i++) a[i] = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w[i] + k), a[i]);
        }
        if (k < k1) {  /* the block's last k1 - k features: the other lanes read nothing, add 0 * 0 */
            __m256i mask = _mm256_loadu_si256((const __m256i *)(ramp + 8 - (k1 - k)));
            __m256 xv = _mm256_maskload_ps(x + k, mask);
            for (int i = 0; i < 8; i++) a[i] = _mm256_fmadd_ps(xv, _mm256_maskload_ps(w[i] + k, mask), a[i]);
        }
        for (int i = 0; i < 8; i++) {
            float sum = reduce8(a[i]);
            sums[i] = k0 == 0 ? sum : sums[i] + sum;
        }
    }
}

/* One row in the order of two or more rows (each output one chain of fused multiply-adds over its
 * block's features), with the lanes over outputs instead of rows: a row among identical companions
 * (a lone row computed as a pair) at the cost of one row, where lanes over rows would fill one in 8.
 * 8x8 tiles of the weight (8 outputs, 8 features) are transposed in registers, so that lane i
 * chains output o0 + i; OUT_GROUPS groups of 8 outputs at once keep that many chains in flight.
 * The same fused multiply-adds in the same order as chain_linear's rows: the same bits. */
#define OUT_GROUPS 2  /* 2 measured fastest: more spill the 16 AVX2 registers */

static inline void transpose8(__m256 *r) {
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(s0, s4, 0x20); r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
    r[2] = _mm256_permute2f128_ps(s2, s6, 0x20); r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
    r[4] = _mm256_permute2f128_ps(s0, s4, 0x31); r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    r[6] = _mm256_permute2f128_ps(s2, s6, 0x31); r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

static void chained_row(const float *x, const float *const *w, int K, int kblock, __m256 *total) {
    for (int k0 = 0; k0 < K; k0 += kblock) {
        int k1 = k0 + kblock < K ? k0 + kblock : K;
        __m256 a[OUT_GROUPS];
        for (int g = 0; g < OUT_GROUPS; g++) a[g] = _mm256_setzero_ps();
        int k = k0;
        for (; k + LANES <= k1; k += LANES) {
            for (int g = 0; g < OUT_GROUPS; g++) {
                __m256 c[LANES];
                for (int i = 0; i < LANES; i++) c[i] = _mm256_loadu_ps(w[g * LANES + i] + k);
                transpose8(c);  /* c[j]: feature k + j of the group's 8 outputs */
                for (int j = 0; j < LANES; j++) a[g] = _mm256_fmadd_ps(c[j], _mm256_broadcast_ss(x + k + j), a[g]);
            }
        }
        for (; k < k1; k++)  /* the block's last features, one at a time */
            for (int g = 0; g < OUT_GROUPS; g++) {
                const float *const *wg = w + g * LANES;
                __m256 c = _mm256_setr_ps(wg[0][k], wg[1][k], wg[2][k], wg[3][k], wg[4][k], wg[5][k], wg[6][k],
                                          wg[7][k]);
                a[g] = _mm256_fmadd_ps(c, _mm256_broadcast_ss(x + k), a[g]);
            }
        for (int g = 0; g < OUT_GROUPS; g++) total[g] = k0 == 0 ? a[g] : _mm256_add_ps(total[g], a[g]);
    }
}

/* x: one row of K, w: out x K, bias: out or NULL, y: out; every output with the bits it has in a
 * product of two or more rows (what chain_linear gives each row of a pair of copies of x). */
int chain_linear_chained_row(const float *x, const float *w, const float *bias, float *y, int K, int out,
                             int kblock, int threads) {
    int width = OUT_GROUPS * LANES, blocks = (out + width - 1) / width;
    threads = team((long)K * out, threads);
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int b = 0; b < blocks; b++) {
        int o0 = b * width, n = out - o0 < width ? out - o0 : width;
        const float *rows_of_w[OUT_GROUPS * LANES];
        float sums[OUT_GROUPS * LANES];
        __m256 total[OUT_GROUPS];
        for (int g = 0; g < OUT_GROUPS; g++) total[g] = _mm256_setzero_ps();  /* K > 0: all overwritten */
        for (int i = 0; i < width; i++) rows_of_w[i] = w + (size_t)(o0 + (i < n ? i : 0)) * K;
        chained_row(x, rows_of_w, K, kblock, total);
        for (int g = 0; g < OUT_GROUPS; g++) _mm256_storeu_ps(sums + g * LANES, total[g]);
        for (int i = 0; i < n; i++) y[o0 + i] = bias ? sums[i] + bias[o0 + i] : sums[i];
    }
    return 0;
}

/* Writes the lanes of `total` (outputs o0.. of the 8-row groups from `group`) into `yt`, the result
 * transposed (out x rp): each lane run is contiguous there; y is written from it once, in order. */
static void store(const __m256 *total, int n, int groups, int group, int o0, float *yt, int rp) {
    for (int i = 0; i < n; i++)
        for (int g = 0; g < groups; g++)
            _mm256_storeu_ps(yt + (size_t)(o0 + i) * rp + (group + g) * LANES, total[i * groups + g]);
}

enum kernel { BLOCK_8X1, BLOCK_6X2, BLOCK_12X2_AVX512 };

/* Rows of the 8-row groups first..end-1 (end - first a multiple of the kernel's groups), every output;
 * threads take whole blocks of outputs. Returns end. */
static int run_groups(enum kernel kernel, const float *xt, int rp, int first, int end, const float *w, int out,
                      int K, int kblock, float *yt, int threads) {
    if (end <= first) return first;
    int outputs = kernel == BLOCK_12X2_AVX512 ? 12 : kernel == BLOCK_6X2 ? 6 : 8;
    int step = kernel == BLOCK_12X2_AVX512 ? 4 : kernel == BLOCK_6X2 ? 2 : 1;  /* 8-row groups a block takes */
    int blocks = (out + outputs - 1) / outputs;
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int b = 0; b < blocks; b++) {
        int o0 = b * outputs, n = out - o0 < outputs ? out - o0 : outputs;
        const float *rows_of_w[12];
        for (int i = 0; i < outputs; i++) rows_of_w[i] = w + (size_t)(o0 + (i < n ? i : 0)) * K;
        __m256 total[48];
        for (int group = first; group < end; group += step) {
            if (kernel == BLOCK_12X2_AVX512) block_12x2_avx512(xt, rp, group, rows_of_w, K, kblock, (float *)total);
            else if (kernel == BLOCK_6X2) block_6x2(xt, rp, group, rows_of_w, K, kblock, total);
            else block_8x1(xt, rp, group, rows_of_w, K, kblock, total);
            store(total, n, step, group, o0, yt, rp);
        }
    }
    return end;
}

/* x: rows x K, w: out x K, bias: out or NULL, y: rows x out, all contiguous float32. Returns 0, or -1
 * when the transposed input could not be allocated. */
int chain_linear(const float *x, const float *w, const float *bias, float *y, int rows, int K, int out,
                 int kblock, int threads) {
    threads = team((long)(rows == 1 ? 1 : (rows + LANES - 1) / LANES * LANES) * K * out, threads);
    if (rows == 1) {
        int blocks = (out + 7) / 8;
        #pragma omp parallel for num_threads(threads) schedule(static)
        for (int b = 0; b < blocks; b++) {
            int o0 = b * 8, n = out - o0 < 8 ? out - o0 : 8;
            const float *rows_of_w[8];
            float sums[8];
            for (int i = 0; i < 8; i++) rows_of_w[i] = w + (size_t)(o0 + (i < n ? i : 0)) * K;
            one_row(x, rows_of_w, K, kblock, sums);
            for (int i = 0; i < n; i++) y[o0 + i] = bias ? sums[i] + bias[o0 + i] : sums[i];
        }
        return 0;
    }
    __builtin_cpu_init();
    int avx512 = rows > LANES && __builtin_cpu_supports("avx512f");
    int rp = (rows + LANES - 1) / LANES * LANES, groups = rp / LANES;  /* 8-row groups */
    float *xt = aligned_alloc(64, ((size_t)K * rp * sizeof(float) + 63) / 64 * 64);
    if (!xt) return -1;
    /* x's rows are read in order; 8 of them at a time, so that each k writes 32 contiguous bytes */
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int g = 0; g < groups; g++) {
        float *dst = xt + g * LANES;
        const float *src[LANES];
        int n = rows - g * LANES < LANES ? rows - g * LANES : LANES;
        for (int l = 0; l < LANES; l++) src[l] = x + (size_t)(g * LANES + (l < n ? l : 0)) * K;
        for (int k = 0; k < K; k++, dst += rp)
            for (int l = 0; l < LANES; l++) dst[l] = l < n ? src[l][k] : 0.0f;
    }
    /* Whole 32-row groups with AVX-512, then pairs of 8-row groups, then one 8-row group: every
     * kernel computes the same chains, so a row's bits do not depend on which one ran it. */
    float *yt = aligned_alloc(64, ((size_t)out * rp * sizeof(float) + 63) / 64 * 64);
    if (!yt) {
        free(xt);
        return -1;
    }
    int group = 0;
    if (avx512) group = run_groups(BLOCK_12X2_AVX512, xt, rp, group, rows / (4 * LANES) * 4, w, out, K, kblock, yt,
                                   threads);
    group = run_groups(BLOCK_6X2, xt, rp, group, group + (groups - group) / 2 * 2, w, out, K, kblock, yt, threads);
    run_groups(BLOCK_8X1, xt, rp, group, groups, w, out, K, kblock, yt, threads);
    /* y from its transpose, 8 rows at a time, each row written in order; the bias last */
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int g = 0; g < groups; g++) {
        int n = rows - g * LANES < LANES ? rows - g * LANES : LANES;
        for (int o = 0; o < out; o++) {
            const float *src = yt + (size_t)o * rp + g * LANES;
            for (int l = 0; l < n; l++)
                y[(size_t)(g * LANES + l) * out + o] = bias ? src[l] + bias[o] : src[l];
        }
    }
    free(yt);
    free(xt);
    return 0;
}
