/* cuda_backend_test.c - cuda start-up anywhere: a gpu answers, or auto falls back to cpu. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "worker/backend.h"
#include "worker/kv.h"
#ifdef RKV_CUDA
#include "worker/cuda/cuda_backend.h"
#endif

/* auto always gives a working backend: cuda where a gpu answers, else cpu */
static void test_auto_starts(void **state)
{
    (void)state;
    struct backend_opts o = {"auto", 1, 0};
    struct backend *be = NULL;
    char err[256];
    assert_int_equal(backend_create(&o, &be, err, sizeof(err)), 0);
    const char *name = backend_name(be);
    assert_true(!strcmp(name, "cpu") || !strcmp(name, "cuda"));
    backend_destroy(be);
}

#ifdef RKV_CUDA
/* without a gpu (ci, this build machine) a forced cuda backend fails with
 * RKV_ENODEV and a message naming the fix; with one it starts */
static void test_forced_cuda(void **state)
{
    (void)state;
    struct backend_opts o = {"cuda", 1, 0};
    struct backend *be = NULL;
    char err[256] = "";
    int n = rkv_cuda_backend_probe();
    int rc = backend_create(&o, &be, err, sizeof(err));
    if (n > 0) {
        assert_int_equal(rc, 0);
        assert_string_equal(backend_name(be), "cuda");
        backend_destroy(be);
        return;
    }
    assert_int_equal(n, RKV_ENODEV);
    assert_int_equal(rc, RKV_ENODEV);
    assert_non_null(strstr(err, "--backend cpu"));
    /* the direct hook says the same */
    err[0] = '\0';
    assert_int_equal(cuda_backend_create(&o, &be, err, sizeof(err)), RKV_ENODEV);
    assert_non_null(strstr(err, "gpu 0"));
    assert_non_null(strstr(err, "--backend cpu"));
}

/* a gpu ordinal past the last device is refused, never a crash */
static void test_bad_ordinal(void **state)
{
    (void)state;
    struct backend_opts o = {"cuda", 1, 1000};
    struct backend *be = NULL;
    assert_int_equal(rkv_cuda_backend_create(&o, &be), RKV_ENODEV);
}

/* a kv layout whose position blocks are several blocks (local layers' kv dropped outside
 * their window) is refused at set_kv: the kernels address a layer inside one block */
static void test_split_layout_refused(void **state)
{
    (void)state;
    if (rkv_cuda_backend_probe() <= 0)
        return; /* no gpu: nothing to attach to */
    struct backend_opts o = {"cuda", 1, 0};
    struct backend *be = NULL;
    char err[256] = "";
    assert_int_equal(backend_create(&o, &be, err, sizeof(err)), 0);
    struct kv_layout l;
    assert_int_equal(kv_layout_init(&l, 16, 7, 1, 32, KV_F16), 0);
    assert_int_equal(kv_layout_set_window(&l, 8, 6), 0);
    assert_int_equal(l.n_parts, 7);
    struct kv_pools none = {{NULL, NULL}, {0, 0}};
    assert_int_equal(backend_set_kv(be, &l, &none), RKV_EUNSUPPORTED);
    /* the one-block layout of the same model attaches */
    assert_int_equal(kv_layout_init(&l, 16, 7, 1, 32, KV_F16), 0);
    assert_int_equal(backend_set_kv(be, &l, &none), 0);
    backend_destroy(be);
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_auto_starts),
#ifdef RKV_CUDA
        cmocka_unit_test(test_forced_cuda),
        cmocka_unit_test(test_bad_ordinal),
        cmocka_unit_test(test_split_layout_refused),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
