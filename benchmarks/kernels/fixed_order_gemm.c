// y[m, n] = sum_k x[m, k] * W[n, k] (+ b[n]), each output a sequential FMA chain over k = 0..K-1.
// W is packed once as P[N/16][K][16]. Variants: avx512 (one zmm per panel), avx2 (two ymm), scalar fmaf.
#include <immintrin.h>
#include <math.h>
#include <stddef.h>
void pack(const float *W, float *P, int N, int K) {
    for (int p = 0; p < N / 16; p++)
        for (int k = 0; k < K; k++)
            for (int j = 0; j < 16; j++) P[((size_t)p * K + k) * 16 + j] = W[(size_t)(p * 16 + j) * K + k];
}
#define PANELS 4
#if defined(VARIANT_AVX512)
void gemm(const float *x, const float *P, const float *b, float *y, int M, int N, int K) {
    int panels = N / 16;
    #pragma omp parallel for schedule(static)
    for (int p0 = 0; p0 < panels; p0 += PANELS) {
        int np = panels - p0 < PANELS ? panels - p0 : PANELS;
        for (int m = 0; m < M; m++) {
            __m512 acc[PANELS];
            for (int q = 0; q < PANELS; q++) acc[q] = _mm512_setzero_ps();
            const float *xm = x + (size_t)m * K;
            for (int k = 0; k < K; k++) {
                __m512 xv = _mm512_set1_ps(xm[k]);
                for (int q = 0; q < np; q++)
                    acc[q] = _mm512_fmadd_ps(xv, _mm512_loadu_ps(P + ((size_t)(p0 + q) * K + k) * 16), acc[q]);
            }
            for (int q = 0; q < np; q++) {
                __m512 r = acc[q];
                if (b) r = _mm512_add_ps(r, _mm512_loadu_ps(b + (p0 + q) * 16));
                _mm512_storeu_ps(y + (size_t)m * N + (p0 + q) * 16, r);
            }
        }
    }
}
#elif defined(VARIANT_AVX2)
void gemm(const float *x, const float *P, const float *b, float *y, int M, int N, int K) {
    int panels = N / 16;
    #pragma omp parallel for schedule(static)
    for (int p0 = 0; p0 < panels; p0 += PANELS) {
        int np = panels - p0 < PANELS ? panels - p0 : PANELS;
        for (int m = 0; m < M; m++) {
            __m256 lo[PANELS], hi[PANELS];
            for (int q = 0; q < PANELS; q++) lo[q] = hi[q] = _mm256_setzero_ps();
            const float *xm = x + (size_t)m * K;
            for (int k = 0; k < K; k++) {
                __m256 xv = _mm256_set1_ps(xm[k]);
                for (int q = 0; q < np; q++) {
                    const float *w = P + ((size_t)(p0 + q) * K + k) * 16;
                    lo[q] = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w), lo[q]);
                    hi[q] = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w + 8), hi[q]);
                }
            }
            for (int q = 0; q < np; q++) {
                __m256 l = lo[q], h = hi[q];
                if (b) { l = _mm256_add_ps(l, _mm256_loadu_ps(b + (p0 + q) * 16)); h = _mm256_add_ps(h, _mm256_loadu_ps(b + (p0 + q) * 16 + 8)); }
                _mm256_storeu_ps(y + (size_t)m * N + (p0 + q) * 16, l);
                _mm256_storeu_ps(y + (size_t)m * N + (p0 + q) * 16 + 8, h);
            }
        }
    }
}
#else
void gemm(const float *x, const float *P, const float *b, float *y, int M, int N, int K) {
    #pragma omp parallel for schedule(static)
    for (int p = 0; p < N / 16; p++)
        for (int m = 0; m < M; m++)
            for (int j = 0; j < 16; j++) {
                float acc = 0.0f;
                for (int k = 0; k < K; k++) acc = fmaf(x[(size_t)m * K + k], P[((size_t)p * K + k) * 16 + j], acc);
                y[(size_t)m * N + p * 16 + j] = b ? acc + b[p * 16 + j] : acc;
            }
}
#endif
