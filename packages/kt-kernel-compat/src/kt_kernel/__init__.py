"""kt_kernel, served by kt (the kt-kernel-compat distribution).

SGLang's kt integration imports `from kt_kernel import KTMoEWrapper, generate_gpu_experts_masks`
and calls `KTMoEWrapper.set_capture_batch_sizes` on the class; training code builds
`KTMoEWrapper(mode="sft")` or `AMXSFTMoEWrapper` directly and imports `kt_kernel.experts` /
`kt_kernel.experts_base`. These are kt-core's, which keep kt-kernel 0.7.2's names, arguments and
semantics (docs/serving.md and docs/training.md say where kt differs). kt-kernel's compiled
`kt_kernel_ext` (CPUInfer, the per-method C++ classes) is not provided.
"""

from __future__ import annotations

from importlib import metadata


def _refuse_beside_kt_kernel() -> None:
    try:
        real = metadata.distribution("kt-kernel")
    except metadata.PackageNotFoundError:
        return
    raise ImportError(f"kt-kernel {real.version} and kt-kernel-compat are both installed, and both provide the "
                      "module kt_kernel (whichever was installed last overwrote the other's files); uninstall one: "
                      "`pip uninstall kt-kernel` to serve with kt, or `pip uninstall kt-kernel-compat` for kt-kernel")


_refuse_beside_kt_kernel()

import kt_core as _kt_core  # noqa: E402
from kt_core import KTMoEWrapper, generate_gpu_experts_masks, select_deferred_experts  # noqa: E402

# kt-kernel's version this module stands in for, and kt's.
__version__ = f"0.7.2+kt{_kt_core.__version__}"
__kt_kernel_api__ = "0.7.2"

__all__ = ["KTMoEWrapper", "generate_gpu_experts_masks", "select_deferred_experts"]   # (AMXSFTMoEWrapper: below)


def __getattr__(name: str):
    # kt-kernel resolves AMXSFTMoEWrapper lazily too: the SFT wrapper needs torch, `import kt_kernel`
    # does not (SGLang's CPU-side imports, the packaging session's install without torch).
    if name == "AMXSFTMoEWrapper":
        from ._sft import AMXSFTMoEWrapper

        return AMXSFTMoEWrapper
    raise AttributeError(f"module 'kt_kernel' has no attribute {name!r}")
