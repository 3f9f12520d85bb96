#include "common.h"

#include <cmath>

namespace KT_TARGET_NAMESPACE {

namespace {

// Input row -> f32, whatever floating type the caller hands in.
void widen_row(const void* in, kt_dtype dtype, int64_t row, int64_t k, int64_t stride, float* out) {
    kt_matrix m{in, dtype, row + 1, k, stride};
    load_row(m, row, out);
}

}  // namespace

kt_status quantize_f32_rows(const void* in, kt_dtype dtype, int64_t rows, int64_t k, int64_t stride, void* out) {
    if (!is_float(dtype)) return fail(KT_ERROR_INVALID_ARGUMENT, "activations must be floating point, got %s", dtype_name(dtype));
    const int64_t padded = round_up(k, 2);
    auto* o = static_cast<float*>(out);
    for (int64_t r = 0; r < rows; ++r) {
        widen_row(in, dtype, r, k, stride, o + r * padded);
        if (padded != k) o[r * padded + k] = 0.0f;
    }
    return KT_OK;
}

kt_status quantize_split_bf16_rows(const void* in, kt_dtype dtype, int64_t rows, int64_t k, int64_t stride, void* out) {
    if (!is_float(dtype)) return fail(KT_ERROR_INVALID_ARGUMENT, "activations must be floating point, got %s", dtype_name(dtype));
    const int64_t padded = round_up(k, 2);
    const size_t row_bytes = split_bf16_row_bytes(k);
    float tmp[512];
    for (int64_t r = 0; r < rows; ++r) {
        auto* base = static_cast<uint8_t*>(out) + size_t(r) * row_bytes;
        auto* header = reinterpret_cast<SplitBf16Header*>(base);
        auto* hi = reinterpret_cast<uint16_t*>(base + sizeof(SplitBf16Header));
        uint16_t* lo = hi + padded;
        int32_t any_lo = 0;
        for (int64_t c0 = 0; c0 < k; c0 += 512) {
            const int64_t n = k - c0 < 512 ? k - c0 : 512;
            const size_t elem = dtype == KT_DTYPE_F64 ? 8 : dtype == KT_DTYPE_F32 ? 4 : 2;
            kt_matrix m{static_cast<const char*>(in) + size_t(c0) * elem, dtype, r + 1, n, stride};
            load_row(m, r, tmp);
            for (int64_t c = 0; c < n; ++c) {
                const uint16_t h = f32_to_bf16(tmp[c]);
                const uint16_t l = f32_to_bf16(tmp[c] - bf16_to_f32(h));
                hi[c0 + c] = h;
                lo[c0 + c] = l;
                any_lo |= (l & 0x7fff) != 0;
            }
        }
        if (padded != k) hi[k] = lo[k] = 0;
        *header = SplitBf16Header{};
        header->has_lo = any_lo;
    }
    return KT_OK;
}

namespace {

inline float hsum(VF v) {
#if defined(__AVX512F__)
    return _mm512_reduce_add_ps(v);
#else
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
#endif
}

}  // namespace

kt_status quantize_int8_rows(const void* in, kt_dtype dtype, int64_t rows, int64_t k, int64_t stride, void* out,
                             bool offset, int64_t sum_block) {
    if (sum_block != 16 && sum_block != 32) return fail(KT_ERROR_INVALID_ARGUMENT, "internal: int8 activation rows sum blocks of 16 or 32 elements, asked for %lld", (long long)sum_block);
    if (!is_float(dtype)) return fail(KT_ERROR_INVALID_ARGUMENT, "activations must be floating point, got %s", dtype_name(dtype));
    const bool small = sum_block == 16;
    const size_t row_bytes = small ? int8_row_bytes<16>(k) : int8_row_bytes<32>(k);
    const size_t elem = dtype == KT_DTYPE_F64 ? 8 : dtype == KT_DTYPE_F32 ? 4 : 2;
    const int64_t code_bytes = int8_codes_bytes(k), blocks = small ? int8_blocks<16>(k) : int8_blocks<32>(k);
    alignas(64) float tmp[512];
    for (int64_t r = 0; r < rows; ++r) {
        auto* base = static_cast<uint8_t*>(out) + size_t(r) * row_bytes;
        auto* hi = reinterpret_cast<int8_t*>(base + sizeof(Int8Header));
        int8_t* lo = hi + code_bytes;
        auto* sums_hi = reinterpret_cast<int32_t*>(lo + code_bytes);
        int32_t* sums_lo = sums_hi + blocks;
        // The chunk [c0, c0 + n) of the row as f32: f32 input read in place (no copy) when the
        // chunk needs no zero padding, anything else widened into tmp.
        const auto chunk = [&](int64_t c0, int64_t n, bool pad) -> const float* {
            if (dtype == KT_DTYPE_F32 && (!pad || n % 32 == 0))
                return static_cast<const float*>(in) + r * stride + c0;
            kt_matrix m{static_cast<const char*>(in) + size_t(c0) * elem, dtype, r + 1, n, stride};
            load_row(m, r, tmp);
            if (pad)
                for (int64_t c = n; c < round_up(n, 32); ++c) tmp[c] = 0.0f;
            return tmp;
        };
        // Pass 1: the row's absolute maximum (a NaN makes the scale NaN, so the output shows it).
        float amax = 0.0f;
        bool nan = false;
        for (int64_t c0 = 0; c0 < k; c0 += 512) {
            const int64_t n = k - c0 < 512 ? k - c0 : 512;
            const float a = row_amax(chunk(c0, n, false), n, nan);
            amax = a > amax ? a : amax;
        }
        const float scale = nan ? NAN : amax / 127.0f;
        const float inv = amax > 0.0f && std::isfinite(amax) ? 127.0f / amax : 0.0f;
        std::memset(hi, 0, size_t(2 * code_bytes));
        std::memset(sums_hi, 0, size_t(2 * blocks) * 4);
        // Pass 2: both code planes and their block sums, a vector at a time (16, 32 | 512, so a
        // sum block never straddles chunks; the row's last chunk ends at a 32 boundary
        // or at k, where the zero-padded tail contributes nothing).
        const VF vinv = vset1(inv), lo_hi = vset1(127.0f), lo_lo = vset1(-127.0f);
        const VF l_hi = vset1(64.0f), l_lo = vset1(-64.0f), s128 = vset1(128.0f);
        for (int64_t c0 = 0; c0 < k && !nan; c0 += 512) {   // a NaN row keeps zero codes: its scale is NaN
            const int64_t n = k - c0 < 512 ? k - c0 : 512;
            const float* x = chunk(c0, n, true);
            const int64_t padded = round_up(n, 32);
            for (int64_t b = 0; b < padded; b += sum_block) {
                VF sum_h = vzero(), sum_l = vzero();
                for (int64_t c = b; c < b + sum_block; c += kLanes) {
                    const VF v = vmul(vload(x + c), vinv);
                    const VF qh = vmax(lo_lo, vmin(lo_hi, vroundint(v)));
                    const VF ql = vmax(l_lo, vmin(l_hi, vroundint(vmul(vsub(v, qh), s128))));
                    store_i8(hi + c0 + c, qh);
                    store_i8(lo + c0 + c, ql);
                    sum_h = vadd(sum_h, qh);
                    sum_l = vadd(sum_l, ql);
                }
                sums_hi[(c0 + b) / sum_block] = int32_t(hsum(sum_h));
                sums_lo[(c0 + b) / sum_block] = int32_t(hsum(sum_l));
            }
        }
        if (offset)
            for (int64_t c = 0; c < 2 * code_bytes; ++c) hi[c] = int8_t(uint8_t(hi[c]) + 128u);
        *reinterpret_cast<Int8Header*>(base) = Int8Header{};
        reinterpret_cast<Int8Header*>(base)->scale = scale;
    }
    return KT_OK;
}

}  // namespace KT_TARGET_NAMESPACE
