#include "quant/kt_codes.h"

#include "pool/thread_pool.h"
#include <kt/formats/quant_rules.h>

#include <cstring>
#include <stdexcept>
#include <vector>

namespace kt {
namespace {

void load_row(const kt_matrix& m, int64_t n, float* out) {
    if (m.dtype == KT_DTYPE_F32) {
        std::memcpy(out, static_cast<const float*>(m.data) + n * m.row_stride, size_t(m.cols) * 4);
        return;
    }
    const auto* h = static_cast<const uint16_t*>(m.data) + n * m.row_stride;
    for (int64_t k = 0; k < m.cols; ++k) {
        const uint32_t bits = uint32_t(h[k]) << 16;   // bf16 widens exactly
        std::memcpy(out + k, &bits, 4);
    }
}

void check_source(const kt_matrix& m) {
    if (m.dtype != KT_DTYPE_F32 && m.dtype != KT_DTYPE_BF16)
        throw std::invalid_argument("kt codes are quantized from float32 or bfloat16 matrices");
}

// Rows in blocks of 16 per task: enough work per task to amortise the fork, enough tasks
// to balance.
template <class Row>
void for_rows(int64_t rows, int64_t cols, Row row) {
    constexpr int64_t kRowsPerTask = 16;
    struct Ctx {
        Row* row;
        int64_t rows, cols;
    } ctx{&row, rows, cols};
    global_pool().parallel_for(
        size_t((rows + kRowsPerTask - 1) / kRowsPerTask),
        [](void* c, size_t t) {
            auto* x = static_cast<Ctx*>(c);
            std::vector<float> buf(size_t(x->cols));
            for (int64_t n = int64_t(t) * kRowsPerTask; n < std::min(x->rows, int64_t(t + 1) * kRowsPerTask); ++n)
                (*x->row)(n, buf.data());
        },
        &ctx);
}

}  // namespace

void quantize_int8_codes(const kt_matrix& src, int8_t* codes, float* scales) {
    check_source(src);
    const int64_t K = src.cols;
    for_rows(src.rows, K, [&](int64_t n, float* row) {
        load_row(src, n, row);
        scales[n] = quant::quantize_symmetric(row, K, 127.0f, -127, 127, codes + n * K);
    });
}

void quantize_int4_codes(const kt_matrix& src, int64_t group, bool zero_point, uint8_t* packed, float* scales,
                         uint8_t* zeros) {
    check_source(src);
    const int64_t K = src.cols;
    if (group <= 0 || K % group != 0 || group % 2 != 0)
        throw std::invalid_argument("INT4 group size " + std::to_string(group) + " must be even and divide K = " +
                                    std::to_string(K));
    const int64_t groups = K / group;
    for_rows(src.rows, K, [&](int64_t n, float* row) {
        load_row(src, n, row);
        std::vector<uint8_t> u(static_cast<size_t>(group));
        for (int64_t g = 0; g < groups; ++g) {
            const float* w = row + g * group;
            float s;
            if (zero_point) {
                int z = 0;
                s = quant::quantize_asymmetric(w, group, u.data(), &z);
                zeros[n * groups + g] = uint8_t(z);
            } else {
                s = quant::quantize_symmetric(w, group, 7.0f, -8, 7, reinterpret_cast<int8_t*>(u.data()));
                for (auto& c : u) c = uint8_t(int8_t(c) + 8);
            }
            scales[n * groups + g] = s;
            uint8_t* out = packed + n * (K / 2) + g * group / 2;
            for (int64_t j = 0; j < group / 2; ++j) out[j] = uint8_t(u[size_t(2 * j)] | (u[size_t(2 * j + 1)] << 4));
        }
    });
}

}  // namespace kt
