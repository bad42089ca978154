#include "kernels/gemm_mkl.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* CBLAS and MKL service constants (mkl_cblas.h, mkl_service.h): MKL is loaded, not linked,
 * so its headers are not needed to build. */
enum { CBLAS_ROW_MAJOR = 101, CBLAS_NO_TRANS = 111, CBLAS_TRANS = 112, MKL_THREADING_GNU = 3 };
enum { MKL_CBWR_AUTO = 2, MKL_CBWR_STRICT = 0x10000, MKL_CBWR_SUCCESS = 0 };

typedef void (*sgemm_fn)(int layout, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                         const float *B, int ldb, float beta, float *C, int ldc);
typedef void (*gemm_bf16_fn)(int layout, int ta, int tb, int M, int N, int K, float alpha, const uint16_t *A,
                             int lda, const uint16_t *B, int ldb, float beta, float *C, int ldc);

struct mkl_blas {
    void *lib;
    sgemm_fn sgemm;
    gemm_bf16_fn gemm_bf16; /* NULL unless this MKL has it and the CPU runs bf16 natively */
    char path[512];
};

#ifndef STEPSCOPE_MKL_DIR
#define STEPSCOPE_MKL_DIR ""
#endif

static void *open_first(char *path, size_t pathlen) {
    /* STEPSCOPE_MKL_LIBRARY, when set, names the one file to load. Else the venv the build saw
     * (install_deps.sh pip-installs `mkl` there), then the usual loader search
     * (LD_LIBRARY_PATH, ldconfig); newest soname first. */
    const char *chosen = getenv("STEPSCOPE_MKL_LIBRARY");
    if (chosen && chosen[0]) {
        snprintf(path, pathlen, "%s", chosen);
        return dlopen(path, RTLD_NOW | RTLD_LOCAL);
    }
    static const char *const names[] = {"libmkl_rt.so.3", "libmkl_rt.so.2", "libmkl_rt.so"};
    for (int dir = 0; dir < 2; dir++)
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
            if (dir == 0 && !STEPSCOPE_MKL_DIR[0]) continue;
            snprintf(path, pathlen, "%s%s%s", dir == 0 ? STEPSCOPE_MKL_DIR : "", dir == 0 ? "/" : "", names[i]);
            /* RTLD_LOCAL: MKL's cblas_* must not interpose on another BLAS the process has. */
            void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
            if (lib) return lib;
        }
    return NULL;
}

/* MKL's threading and reproducibility settings are the process's, and must be made before its
 * first product: it is loaded and set up once, and every gemm context shares the result. */
static mkl_blas_t the_mkl;
static char the_mkl_error[600];
static bool the_mkl_ok;
static pthread_once_t the_mkl_once = PTHREAD_ONCE_INIT;

static void load_once(void) {
    mkl_blas_t *mkl = &the_mkl;
    char *err = the_mkl_error;
    size_t errlen = sizeof the_mkl_error;
    if (!(mkl->lib = open_first(mkl->path, sizeof mkl->path))) {
        const char *chosen = getenv("STEPSCOPE_MKL_LIBRARY");
        if (chosen && chosen[0])
            snprintf(err, errlen, "gemm_library=mkl: cannot load %s (STEPSCOPE_MKL_LIBRARY): %s; point it at "
                     "libmkl_rt.so or use gemm_library=onednn", chosen, dlerror());
        else
            snprintf(err, errlen, "gemm_library=mkl: libmkl_rt.so not found (in %s or the loader's path); install "
                     "it with `.venv/bin/pip install mkl` (tools/install_deps.sh does) or use gemm_library=onednn",
                     STEPSCOPE_MKL_DIR[0] ? STEPSCOPE_MKL_DIR : "no venv");
        return;
    }
    int (*set_threading_layer)(int) = (int (*)(int))dlsym(mkl->lib, "MKL_Set_Threading_Layer");
    void (*set_dynamic)(int) = (void (*)(int))dlsym(mkl->lib, "MKL_Set_Dynamic");
    int (*cbwr_set)(int) = (int (*)(int))dlsym(mkl->lib, "MKL_CBWR_Set");
    mkl->sgemm = (sgemm_fn)dlsym(mkl->lib, "cblas_sgemm");
    /* MKL emulates bf16 on older CPUs at a fraction of fp32's speed; only take it where the
     * CPU has the instructions. */
    if (__builtin_cpu_supports("avx512bf16") || __builtin_cpu_supports("amx-bf16"))
        mkl->gemm_bf16 = (gemm_bf16_fn)dlsym(mkl->lib, "cblas_gemm_bf16bf16f32");
    if (!set_threading_layer || !set_dynamic || !cbwr_set || !mkl->sgemm) {
        snprintf(err, errlen, "gemm_library=mkl: %s lacks MKL_Set_Threading_Layer, MKL_Set_Dynamic, MKL_CBWR_Set or "
                 "cblas_sgemm; reinstall the `mkl` wheel or use gemm_library=onednn", mkl->path);
        return; /* not dlclose'd: a half-initialised MKL may have started threads */
    }
    /* Before any other MKL call: its own OpenMP (libiomp5) beside libgomp would give two
     * thread pools fighting for two cores. */
    set_threading_layer(MKL_THREADING_GNU);
    set_dynamic(0);
    /* Strict conditional numerical reproducibility: by default MKL splits some products
     * differently by thread count (a 2-layer qwen3-0.6b's gradient norm moved in the 8th digit
     * between num_threads=1 and 2), and stepscope's results must not depend on the thread
     * count. */
    if (cbwr_set(MKL_CBWR_AUTO | MKL_CBWR_STRICT) != MKL_CBWR_SUCCESS) {
        snprintf(err, errlen, "gemm_library=mkl: %s refused strict reproducible mode (MKL_CBWR_Set); use "
                 "gemm_library=onednn", mkl->path);
        return;
    }
    the_mkl_ok = true;
}

const mkl_blas_t *mkl_blas_open(char *err, size_t errlen) {
    pthread_once(&the_mkl_once, load_once);
    if (!the_mkl_ok) {
        snprintf(err, errlen, "%s", the_mkl_error);
        return NULL;
    }
    return &the_mkl;
}

const char *mkl_blas_path(const mkl_blas_t *mkl) { return mkl->path; }

static int dim(int64_t v) {
    if (v > INT_MAX) {
        /* Shapes come from the plan, which keeps every matrix dimension far below 2^31. */
        fprintf(stderr, "stepscope: internal error: GEMM dimension %lld exceeds MKL's 32-bit interface\n", (long long)v);
        abort();
    }
    return (int)v;
}

void mkl_sgemm(const mkl_blas_t *mkl, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
               const float *A, int64_t lda, const float *B, int64_t ldb, float *C, int64_t ldc, bool accumulate) {
    mkl->sgemm(CBLAS_ROW_MAJOR, trans_a ? CBLAS_TRANS : CBLAS_NO_TRANS, trans_b ? CBLAS_TRANS : CBLAS_NO_TRANS,
               dim(M), dim(N), dim(K), 1.0f, A, dim(lda), B, dim(ldb), accumulate ? 1.0f : 0.0f, C, dim(ldc));
}

bool mkl_has_bf16(const mkl_blas_t *mkl) { return mkl->gemm_bf16 != NULL; }

void mkl_gemm_bf16(const mkl_blas_t *mkl, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                   const uint16_t *A, int64_t lda, const uint16_t *B, int64_t ldb, float *C, int64_t ldc,
                   bool accumulate) {
    mkl->gemm_bf16(CBLAS_ROW_MAJOR, trans_a ? CBLAS_TRANS : CBLAS_NO_TRANS, trans_b ? CBLAS_TRANS : CBLAS_NO_TRANS,
                   dim(M), dim(N), dim(K), 1.0f, A, dim(lda), B, dim(ldb), accumulate ? 1.0f : 0.0f, C, dim(ldc));
}
