// What the CPU *and* the operating system let this process execute. Compiled for the
// baseline ISA only (no -m flags): this file must never execute an instruction the
// host may lack, since it is what decides which kernels are safe to load.
#pragma once
#include <string>
#include <vector>

namespace kt {

struct CpuFeatures {
    std::string arch;           // "x86_64" or "aarch64" (uname machine)
    std::string vendor;         // "AuthenticAMD", "GenuineIntel", implementer on arm
    std::string brand;          // model name
    // Lower-case feature names usable by this process: CPU support AND OS-enabled state.
    // x86: sse4_2 popcnt avx avx2 fma f16c bmi1 bmi2 lzcnt movbe avx512f avx512bw avx512vl
    //      avx512dq avx512cd avx512_vnni avx512_bf16 avx512_vbmi avx512_fp16 avx_vnni
    //      amx_tile amx_int8 amx_bf16
    // aarch64: neon asimddp (dotprod) i8mm bf16 sve sve2
    std::vector<std::string> features;
    // Why a feature the CPU has is not usable (e.g. "avx512f: CPU has it, OS does not
    // enable ZMM state in XCR0"). Empty when everything the CPU reports is usable.
    std::vector<std::string> notes;
    bool os_saves_ymm = false;      // XCR0 bits 1,2
    bool os_saves_zmm = false;      // XCR0 bits 5,6,7
    bool os_saves_amx = false;      // XCR0 bits 17,18
    bool amx_permission = false;    // arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) granted
    int sve_vector_bits = 0;        // aarch64 with SVE: this thread's vector length (prctl PR_SVE_GET_VL)
};

// Detected once and cached. Requests AMX tile permission from Linux when the CPU has AMX.
const CpuFeatures& cpu_features();

}  // namespace kt
