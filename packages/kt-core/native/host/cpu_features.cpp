#include "host/cpu_features.h"

#include <sys/utsname.h>

#include <cstdint>
#include <cstdio>
#include <string>

#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#elif defined(__aarch64__)
#include <sys/auxv.h>
#include <sys/prctl.h>

#include <fstream>
#endif

namespace kt {
namespace {

std::string machine_name() {
    struct utsname u {};
    if (uname(&u) != 0) return {};
    return u.machine;
}

#if defined(__x86_64__)

// Which OS-managed register state a feature needs before its instructions may execute.
enum class State { none, ymm, zmm, amx };

enum class Reg { l1_ecx, l7_ebx, l7_ecx, l7_edx, l7s1_eax, e1_ecx };

struct FeatureBit {
    const char* name;
    Reg reg;
    int bit;
    State state;
};

// Bit positions from the Intel SDM vol. 2A CPUID table and the AMD APM vol. 3.
constexpr FeatureBit kFeatureBits[] = {
    {"sse4_2", Reg::l1_ecx, 20, State::none},
    {"popcnt", Reg::l1_ecx, 23, State::none},
    {"avx", Reg::l1_ecx, 28, State::ymm},
    {"avx2", Reg::l7_ebx, 5, State::ymm},
    {"fma", Reg::l1_ecx, 12, State::ymm},
    {"f16c", Reg::l1_ecx, 29, State::ymm},
    // BMI1/BMI2 are VEX-encoded but only touch general-purpose registers, so they need
    // no XCR0 state.
    {"bmi1", Reg::l7_ebx, 3, State::none},
    {"bmi2", Reg::l7_ebx, 8, State::none},
    {"lzcnt", Reg::e1_ecx, 5, State::none},
    {"movbe", Reg::l1_ecx, 22, State::none},
    {"avx512f", Reg::l7_ebx, 16, State::zmm},
    {"avx512bw", Reg::l7_ebx, 30, State::zmm},
    {"avx512vl", Reg::l7_ebx, 31, State::zmm},
    {"avx512dq", Reg::l7_ebx, 17, State::zmm},
    {"avx512cd", Reg::l7_ebx, 28, State::zmm},
    {"avx512_vnni", Reg::l7_ecx, 11, State::zmm},
    {"avx512_bf16", Reg::l7s1_eax, 5, State::zmm},
    {"avx512_vbmi", Reg::l7_ecx, 1, State::zmm},
    {"avx512_fp16", Reg::l7_edx, 23, State::zmm},
    {"avx_vnni", Reg::l7s1_eax, 4, State::ymm},
    {"amx_tile", Reg::l7_edx, 24, State::amx},
    {"amx_int8", Reg::l7_edx, 25, State::amx},
    {"amx_bf16", Reg::l7_edx, 22, State::amx},
};

constexpr uint64_t kXcr0Ymm = (1u << 1) | (1u << 2);              // SSE, AVX upper halves
constexpr uint64_t kXcr0Zmm = (1u << 5) | (1u << 6) | (1u << 7);  // opmask, ZMM_Hi256, Hi16_ZMM
constexpr uint64_t kXcr0Amx = (1u << 17) | (1u << 18);            // XTILECFG, XTILEDATA

constexpr int kArchGetXcompPerm = 0x1022;
constexpr int kArchReqXcompPerm = 0x1023;
constexpr int kXfeatureXtiledata = 18;

struct Regs {
    uint32_t a = 0, b = 0, c = 0, d = 0;
};

// Zero registers when the leaf is beyond the CPU's maximum, so absent leaves read as
// "no features".
Regs cpuid(uint32_t leaf, uint32_t subleaf) {
    Regs r;
    if (!__get_cpuid_count(leaf, subleaf, &r.a, &r.b, &r.c, &r.d)) r = Regs{};
    return r;
}

// Spelled as inline asm rather than the _xgetbv intrinsic, which would need -mxsave and
// this file must build for the baseline ISA.
uint64_t read_xcr0() {
    uint32_t lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (uint64_t(hi) << 32) | lo;
}

std::string hex(uint64_t v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
    return buf;
}

std::string trim(const std::string& s) {
    const auto first = s.find_first_not_of(' ');
    if (first == std::string::npos) return {};
    return s.substr(first, s.find_last_not_of(' ') - first + 1);
}

// Linux (5.16+) keeps AMX tile data disabled per process until it is asked for; the
// first AMX instruction would otherwise die with SIGILL. Returns an empty string on
// success, else why permission was not granted.
std::string request_amx_permission() {
    if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0)
        return std::string("arch_prctl(ARCH_REQ_XCOMP_PERM) failed: ") + std::strerror(errno);
    unsigned long granted = 0;
    if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &granted) != 0)
        return std::string("arch_prctl(ARCH_GET_XCOMP_PERM) failed: ") + std::strerror(errno);
    if (!(granted & (1ul << kXfeatureXtiledata)))
        return "arch_prctl(ARCH_GET_XCOMP_PERM) does not list XTILEDATA (mask " + hex(granted) + ")";
    return {};
}

void detect(CpuFeatures& f) {
    const Regs l0 = cpuid(0, 0);
    char vendor[13] = {};
    std::memcpy(vendor + 0, &l0.b, 4);
    std::memcpy(vendor + 4, &l0.d, 4);
    std::memcpy(vendor + 8, &l0.c, 4);
    f.vendor = vendor;

    if (cpuid(0x80000000, 0).a >= 0x80000004) {
        char brand[49] = {};
        for (uint32_t i = 0; i < 3; ++i) {
            const Regs r = cpuid(0x80000002 + i, 0);
            std::memcpy(brand + 16 * i + 0, &r.a, 4);
            std::memcpy(brand + 16 * i + 4, &r.b, 4);
            std::memcpy(brand + 16 * i + 8, &r.c, 4);
            std::memcpy(brand + 16 * i + 12, &r.d, 4);
        }
        f.brand = trim(brand);
    }

    const Regs l1 = cpuid(1, 0);
    const Regs l7 = cpuid(7, 0);
    // Subleaf 1 exists only if leaf 7 subleaf 0 reports it; __get_cpuid_count checks
    // the leaf but not the subleaf.
    const Regs l7s1 = l7.a >= 1 ? cpuid(7, 1) : Regs{};
    const Regs e1 = cpuid(0x80000001, 0);

    const bool osxsave = l1.c & (1u << 27);
    const uint64_t xcr0 = osxsave ? read_xcr0() : 0;
    f.os_saves_ymm = (xcr0 & kXcr0Ymm) == kXcr0Ymm;
    f.os_saves_zmm = (xcr0 & kXcr0Zmm) == kXcr0Zmm;
    f.os_saves_amx = (xcr0 & kXcr0Amx) == kXcr0Amx;
    const std::string xcr0_text = osxsave ? "XCR0=" + hex(xcr0) : "OSXSAVE off, XCR0 unreadable";

    auto has = [&](const FeatureBit& fb) {
        uint32_t word = 0;
        switch (fb.reg) {
            case Reg::l1_ecx: word = l1.c; break;
            case Reg::l7_ebx: word = l7.b; break;
            case Reg::l7_ecx: word = l7.c; break;
            case Reg::l7_edx: word = l7.d; break;
            case Reg::l7s1_eax: word = l7s1.a; break;
            case Reg::e1_ecx: word = e1.c; break;
        }
        return (word >> fb.bit) & 1u;
    };

    bool cpu_has_amx = false;
    for (const auto& fb : kFeatureBits) cpu_has_amx |= fb.state == State::amx && has(fb);
    std::string amx_refusal;
    if (cpu_has_amx && f.os_saves_amx) {
        amx_refusal = request_amx_permission();
        f.amx_permission = amx_refusal.empty();
    }

    for (const auto& fb : kFeatureBits) {
        if (!has(fb)) continue;
        std::string why;
        switch (fb.state) {
            case State::none: break;
            case State::ymm:
                if (!f.os_saves_ymm) why = "the OS does not enable YMM state (" + xcr0_text + ")";
                break;
            case State::zmm:
                if (!f.os_saves_ymm || !f.os_saves_zmm)
                    why = "the OS does not enable ZMM state (" + xcr0_text + ")";
                break;
            case State::amx:
                if (!f.os_saves_amx)
                    why = "the OS does not enable AMX tile state (" + xcr0_text + ")";
                else if (!f.amx_permission)
                    why = "Linux refused tile-data permission: " + amx_refusal;
                break;
        }
        if (why.empty())
            f.features.emplace_back(fb.name);
        else
            f.notes.push_back(std::string(fb.name) + ": the CPU has it but " + why);
    }
}

#elif defined(__aarch64__)

// Linux arm64 ABI hwcap bits (arch/arm64/include/uapi/asm/hwcap.h), spelled out because
// older libc headers lack the newer ones.
constexpr unsigned long kHwcapAsimd = 1ul << 1;
constexpr unsigned long kHwcapAsimddp = 1ul << 20;
constexpr unsigned long kHwcapSve = 1ul << 22;
constexpr unsigned long kHwcap2Sve2 = 1ul << 1;
constexpr unsigned long kHwcap2I8mm = 1ul << 13;
constexpr unsigned long kHwcap2Bf16 = 1ul << 14;

std::string implementer_name(unsigned id) {
    switch (id) {
        case 0x41: return "ARM";
        case 0x42: return "Broadcom";
        case 0x43: return "Cavium";
        case 0x46: return "Fujitsu";
        case 0x48: return "HiSilicon";
        case 0x4e: return "NVIDIA";
        case 0x50: return "APM";
        case 0x51: return "Qualcomm";
        case 0x61: return "Apple";
        case 0xc0: return "Ampere";
    }
    char buf[32];
    std::snprintf(buf, sizeof buf, "implementer 0x%02x", id);
    return buf;
}

void detect(CpuFeatures& f) {
    // Reading MIDR through sysfs avoids trapping into the kernel's mrs emulation and
    // works even where HWCAP_CPUID is absent.
    std::ifstream midr_file("/sys/devices/system/cpu/cpu0/regs/identification/midr_el1");
    unsigned long long midr = 0;
    if (midr_file >> std::hex >> midr) {
        f.vendor = implementer_name(static_cast<unsigned>((midr >> 24) & 0xff));
        char buf[48];
        std::snprintf(buf, sizeof buf, "part 0x%03llx r%llup%llu", (midr >> 4) & 0xfff,
                      (midr >> 20) & 0xf, midr & 0xf);
        f.brand = buf;
    } else {
        f.vendor = "arm";
    }

    // The kernel only sets a hwcap once it also manages the state (e.g. SVE registers),
    // so there is no separate OS check to report in notes.
    const unsigned long hw = getauxval(AT_HWCAP);
    const unsigned long hw2 = getauxval(AT_HWCAP2);
    if (hw & kHwcapAsimd) f.features.emplace_back("neon");
    if (hw & kHwcapAsimddp) f.features.emplace_back("asimddp");
    if (hw2 & kHwcap2I8mm) f.features.emplace_back("i8mm");
    if (hw2 & kHwcap2Bf16) f.features.emplace_back("bf16");
    if (hw & kHwcapSve) f.features.emplace_back("sve");
    if (hw2 & kHwcap2Sve2) f.features.emplace_back("sve2");
    // SVE's vector length is the implementation's (128..2048 bits), possibly lowered by the OS
    // per thread: vector-length-agnostic kernels read it, and doctor reports it.
    constexpr int kPrSveGetVl = 51, kPrSveVlLenMask = 0xffff;
    if (hw & kHwcapSve) {
        const int vl = prctl(kPrSveGetVl, 0, 0, 0, 0);
        if (vl > 0) f.sve_vector_bits = (vl & kPrSveVlLenMask) * 8;
    }
    if (f.brand.empty()) f.brand = "aarch64 CPU (no MIDR_EL1 in sysfs)";
}

#else

void detect(CpuFeatures&) {}

#endif

CpuFeatures detect_all() {
    CpuFeatures f;
    f.arch = machine_name();
    detect(f);
    return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
    static const CpuFeatures features = detect_all();
    return features;
}

}  // namespace kt
