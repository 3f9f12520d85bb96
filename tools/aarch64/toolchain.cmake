# Cross-compiling kt's native modules for aarch64 Linux with Debian's g++-aarch64-linux-gnu, against
# an arm64 root (KT_AARCH64_ROOT: Python headers, NumPy and hwloc for the target; tools/aarch64/
# make_root.sh makes one). The host Python runs CMake and provides nanobind's sources.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
if(NOT KT_AARCH64_ROOT AND DEFINED ENV{KT_AARCH64_ROOT})
  set(KT_AARCH64_ROOT "$ENV{KT_AARCH64_ROOT}")
endif()
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES KT_AARCH64_ROOT)   # try_compile projects read this file too
if(NOT KT_AARCH64_ROOT)
  message(FATAL_ERROR "set KT_AARCH64_ROOT to the arm64 root (tools/aarch64/make_root.sh)")
endif()
# The target's CPython 3.11: headers and the extension suffix (FindPython cannot run the target's interpreter).
set(Python_INCLUDE_DIR "${KT_AARCH64_ROOT}/usr/include/python3.11" CACHE PATH "")
set(SKBUILD_SOABI "cpython-311-aarch64-linux-gnu")   # nanobind names the module with it
set(SKBUILD_SOSABI "abi3")
set(CMAKE_FIND_ROOT_PATH "${KT_AARCH64_ROOT}")
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
# pkg-config (hwloc) reads the root's .pc files and prefixes their paths with the root.
set(ENV{PKG_CONFIG_LIBDIR} "${KT_AARCH64_ROOT}/usr/lib/aarch64-linux-gnu/pkgconfig:${KT_AARCH64_ROOT}/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_SYSROOT_DIR} "${KT_AARCH64_ROOT}")
# The target's pyconfig.h includes <aarch64-linux-gnu/python3.11/pyconfig.h>: kt-include holds only
# that multiarch directory (the rest of the root's /usr/include would shadow the cross compiler's).
include_directories(SYSTEM "${KT_AARCH64_ROOT}/kt-include")
# hwloc.h includes hwloc/autogen/config.h from the multiarch directory (the same bookworm glibc as the
# cross compiler's, so its other headers there are the compiler's own).
include_directories(SYSTEM "${KT_AARCH64_ROOT}/usr/include/aarch64-linux-gnu")
# Link against the root's shared libraries (hwloc and what it needs) without a full sysroot.
set(CMAKE_SHARED_LINKER_FLAGS_INIT "-Wl,-rpath-link,${KT_AARCH64_ROOT}/usr/lib/aarch64-linux-gnu -Wl,-rpath-link,${KT_AARCH64_ROOT}/lib/aarch64-linux-gnu")
set(CMAKE_MODULE_LINKER_FLAGS_INIT "${CMAKE_SHARED_LINKER_FLAGS_INIT}")
