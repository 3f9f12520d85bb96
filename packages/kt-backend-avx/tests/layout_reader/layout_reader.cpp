// A reader of packed experts written only against kt-core's public layout header
// (kt/formats/packed_layouts.h, ggml_panels.h), as a BLIS or KML backend would read kt-backend-avx's bytes:
// test_packed_layouts.py compiles it and checks that it recovers the weights the kernels use.
#include <kt/formats/ggml_panels.h>
#include <kt/formats/packed_layouts.h>

#include <cstring>
#include <string_view>

namespace L = kt::layouts;

namespace {

template <class Weight>
void unpack_matrix(const uint8_t* expert, size_t (L::ExpertPanels::*at)(int64_t) const, const L::ExpertPanels& l,
                   int64_t n_rows, int64_t k_cols, const Weight& weight, float* out) {
    for (int64_t n = 0; n < n_rows; ++n) {
        const uint8_t* panel = expert + (l.*at)(n / L::kPanel);
        for (int64_t k = 0; k < k_cols; ++k) out[n * k_cols + k] = weight(panel, k_cols, k, int(n % L::kPanel));
    }
}

template <class Weight>
void unpack_expert(const uint8_t* expert, const L::ExpertPanels& l, const Weight& weight, float* gate, float* up,
                   float* down) {
    const int64_t H = l.hidden, I = l.intermediate;
    unpack_matrix(expert, &L::ExpertPanels::gate, l, I, H, weight, gate);
    unpack_matrix(expert, &L::ExpertPanels::up, l, I, H, weight, up);
    unpack_matrix(expert, &L::ExpertPanels::down, l, H, I, weight, down);
}

}  // namespace

// Returns the expert's byte count in that layout, or 0 for an id this header does not define.
extern "C" size_t kt_unpack_expert(const char* layout_id, const uint8_t* expert, int64_t hidden, int64_t intermediate,
                                   int64_t group_size, int zero_point, float* gate, float* up, float* down) {
    const std::string_view id(layout_id);
    if (id == L::bf16::kId) {
        const auto l = L::bf16::expert(hidden, intermediate);
        unpack_expert(expert, l, [](const uint8_t* p, int64_t, int64_t k, int lane) { return L::bf16::weight(p, k, lane); },
                      gate, up, down);
        return l.bytes();
    }
    if (id == L::int8::kId) {
        const auto l = L::int8::expert(hidden, intermediate);
        unpack_expert(expert, l, [](const uint8_t* p, int64_t, int64_t k, int lane) { return L::int8::weight(p, k, lane); },
                      gate, up, down);
        return l.bytes();
    }
    if (id == L::int4::kId || id == L::int4::kRawId) {
        const auto geo = L::int4::geometry(id == L::int4::kRawId, group_size, zero_point != 0);
        const auto l = geo.expert(hidden, intermediate);
        unpack_expert(expert, l, [&](const uint8_t* p, int64_t, int64_t k, int lane) { return geo.weight(p, k, lane); },
                      gate, up, down);
        return l.bytes();
    }
    if (id == L::mxfp4::kId) {
        const auto geo = L::mxfp4::geometry();
        const auto l = geo.expert(hidden, intermediate);
        unpack_expert(expert, l, [&](const uint8_t* p, int64_t, int64_t k, int lane) { return L::mxfp4::weight(geo, p, k, lane); },
                      gate, up, down);
        return l.bytes();
    }
    if (id == L::nvfp4::kId) {
        const auto l = L::nvfp4::geometry().expert(hidden, intermediate);
        unpack_expert(expert, l, [](const uint8_t* p, int64_t, int64_t k, int lane) { return L::nvfp4::weight(p, k, lane); },
                      gate, up, down);
        return l.bytes();
    }
    if (id == L::fp8::kIdRows || id == L::fp8::kIdQuads || id == L::mxfp8::kIdRows || id == L::mxfp8::kIdQuads) {
        const bool quads = id == L::fp8::kIdQuads || id == L::mxfp8::kIdQuads;
        const auto geo = id == L::mxfp8::kIdRows || id == L::mxfp8::kIdQuads ? L::mxfp8::geometry(quads) : L::fp8::geometry(quads);
        const auto l = geo.expert(hidden, intermediate);
        unpack_expert(expert, l,
                      [&](const uint8_t* p, int64_t K, int64_t k, int lane) { return L::fp8::weight(geo, p, K, k, lane); },
                      gate, up, down);
        return l.bytes();
    }
    return 0;
}

// LLAMAFILE's "kt-ggml-v8" (kt/formats/ggml_panels.h): gate, up and down of the ggml types
// `types` (kt_dtype values), one matrix after another. Returns the expert's byte count, or 0 when
// a type or K does not fit the layout.
extern "C" size_t kt_unpack_ggml_expert(const int* types, const uint8_t* expert, int64_t hidden, int64_t intermediate,
                                        float* gate, float* up, float* down) {
    namespace G = L::ggml;
    const kt_dtype t[3] = {kt_dtype(types[0]), kt_dtype(types[1]), kt_dtype(types[2])};
    const G::Expert e = G::expert(t, hidden, intermediate);
    if (!e.ok) return 0;
    float* out[3] = {gate, up, down};
    for (int p = 0; p < 3; ++p) {
        const G::Matrix& m = e.m[p];
        G::with_panels(m.type->dtype, [&](auto form) {
            using P = decltype(form);
            for (int64_t n = 0; n < m.rows; ++n) {
                const uint8_t* panel = expert + m.offset + size_t(n / L::kPanel) * m.panel_bytes;
                for (int64_t k = 0; k < m.cols; ++k) out[p][n * m.cols + k] = G::weight<P>(panel, k, int(n % L::kPanel));
            }
        });
    }
    return e.bytes;
}
