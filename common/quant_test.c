/* quant_test.c - the block formats: sizes, f16 conversions, round trips, bad scales found. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "common/quant.h"

static const uint32_t g_blocks[] = {QUANT_Q4_0, QUANT_Q4_1, QUANT_Q5_0, QUANT_Q5_1,
                                    QUANT_Q8_0, QUANT_Q2_K, QUANT_Q3_K, QUANT_Q4_K,
                                    QUANT_Q5_K, QUANT_Q6_K, QUANT_IQ4_NL, QUANT_IQ4_XS};

static void test_sizes(void **state)
{
    (void)state;
    assert_int_equal(quant_row_bytes(QUANT_Q4_K, 4096), 16 * 144);
    assert_int_equal(quant_row_bytes(QUANT_Q4_K, 4000), 0); /* not whole blocks */
    assert_int_equal(quant_row_bytes(QUANT_Q8_0, 64), 68);
    assert_int_equal(quant_row_bytes(QUANT_BF16, 3), 6);
    assert_int_equal(quant_block_values(QUANT_IQ4_XS), 256);
    assert_int_equal(quant_block_values(QUANT_F32), 1);
    assert_true(quant_is_block(QUANT_Q6_K) && !quant_is_block(QUANT_F16));
    /* ggml ids rkv does not read: IQ1_S 19, TQ2_0 35, MXFP4 39, Q8_K 15 */
    static const uint32_t no[] = {4, 5, 9, 15, 16, 19, 35, 39, 1000};
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++) {
        assert_false(quant_supported(no[i]));
        assert_null(quant_name(no[i]));
        assert_int_equal(quant_row_bytes(no[i], 256), 0);
        float y[256];
        assert_int_equal(quant_dequantize_row(no[i], y, y, 256), RKV_EINVAL);
    }
    assert_string_equal(quant_name(QUANT_IQ4_NL), "IQ4_NL");
}

/* every f16 converts exactly and back; f32 rounds to nearest even like the F16C
 * instructions at the tie, overflow, subnormal and NaN edges */
static void test_f16(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = quant_f16_to_f32((uint16_t)h);
        uint16_t back = quant_f32_to_f16(f);
        if (isnan(f))
            assert_true((back & 0x7c00) == 0x7c00 && (back & 0x3ff));
        else
            assert_int_equal(back, h);
    }
    assert_int_equal(quant_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(quant_f32_to_f16(65519.0f), 0x7bff);
    assert_int_equal(quant_f32_to_f16(65520.0f), 0x7c00);
    assert_int_equal(quant_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);         /* tie: even */
    assert_int_equal(quant_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);     /* tie: even up */
    assert_int_equal(quant_f32_to_f16(0x1p-25f), 0x0000);                /* half the least */
    assert_int_equal(quant_f32_to_f16(0x1.000002p-25f), 0x0001);         /* above half */
    assert_int_equal(quant_f32_to_f16(-0x1p-24f), 0x8001);
    assert_int_equal(quant_f32_to_f16(0x1.ff8p-15f), 0x03ff);            /* largest subnormal */
    assert_int_equal(quant_f32_to_f16(0x1.ffcp-15f), 0x0400);            /* tie: up to normal */
}

/* a row of 512 smooth values through every format: within its levels' error */
static void test_round_trip(void **state)
{
    (void)state;
    enum { N = 512 };
    float x[N], y[N];
    uint8_t buf[N * 4];
    for (int i = 0; i < N; i++)
        x[i] = sinf((float)i * 0.37f) * (1.0f + (float)(i % 7)) - 0.25f;
    for (size_t k = 0; k < sizeof g_blocks / sizeof g_blocks[0]; k++) {
        uint32_t t = g_blocks[k];
        memset(buf, 0xa5, sizeof buf);
        assert_int_equal(quant_quantize_row(t, x, buf, N), 0);
        assert_int_equal(quant_dequantize_row(t, buf, y, N), 0);
        double se = 0, sx = 0;
        for (int i = 0; i < N; i++) {
            se += (double)(y[i] - x[i]) * (y[i] - x[i]);
            sx += (double)x[i] * x[i];
        }
        double rel = sqrt(se / sx);
        double lim = t == QUANT_Q2_K ? 0.35 : t == QUANT_Q3_K ? 0.2 : t == QUANT_Q8_0 ? 0.01 : 0.1;
        if (!(rel < lim)) {
            print_error("%s: relative rms error %.4f over %.3f\n", quant_name(t), rel, lim);
            fail();
        }
        /* all zeros stay zeros */
        float z[N] = {0};
        assert_int_equal(quant_quantize_row(t, z, buf, N), 0);
        assert_int_equal(quant_dequantize_row(t, buf, y, N), 0);
        for (int i = 0; i < N; i++)
            assert_true(y[i] == 0.0f);
    }
}

static void test_bad_scale(void **state)
{
    (void)state;
    uint8_t buf[4 * 210];
    float x[1024];
    for (int i = 0; i < 1024; i++)
        x[i] = (float)(i % 13) - 6.0f;
    size_t bad = 99;
    assert_int_equal(quant_quantize_row(QUANT_Q6_K, x, buf, 1024), 0);
    assert_int_equal(quant_row_bad_scale(QUANT_Q6_K, buf, 1024, &bad), 0);
    uint16_t nan = 0x7e00, inf = 0xfc00;
    memcpy(buf + 2 * 210 + 208, &nan, 2);
    assert_int_equal(quant_row_bad_scale(QUANT_Q6_K, buf, 1024, &bad), 1);
    assert_int_equal(bad, 2);
    /* the min of a Q4_1 block counts too */
    uint8_t q41[2 * 20];
    assert_int_equal(quant_quantize_row(QUANT_Q4_1, x, q41, 64), 0);
    assert_int_equal(quant_row_bad_scale(QUANT_Q4_1, q41, 64, &bad), 0);
    memcpy(q41 + 20 + 2, &inf, 2);
    assert_int_equal(quant_row_bad_scale(QUANT_Q4_1, q41, 64, &bad), 1);
    assert_int_equal(bad, 1);
    /* float types have no scales */
    assert_int_equal(quant_row_bad_scale(QUANT_F16, buf, 16, &bad), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_f16),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_bad_scale),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
