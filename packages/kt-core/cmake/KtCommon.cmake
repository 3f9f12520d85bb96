# Shared CMake helpers for kt packages. kt-core installs this file next to its CMake
# package config, so backends built outside the workspace use the same rules.
include_guard(GLOBAL)

# Warnings every kt target compiles with.
function(kt_target_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter)
endfunction()

# A Python extension module built the kt way: nanobind, statically linked nanobind runtime
# (no nanobind object crosses a wheel boundary, so each wheel carries its own), the stable
# ABI where the interpreter supports it (CPython >= 3.12), warnings on. Link-time optimization
# where the toolchain can do it: some compilers ship without a working lto-wrapper, and a
# missing optimization must not fail the build. NOMINSIZE: nanobind compiles a module's sources
# with -Os by default, which reached kt-core's own loops (training's row passes, the LoRA products):
# summing 16384 x 2048 rows after a large write took 16-17.6 ms at -Os, 13.1-14.8 at -O3 (Zen 4,
# alternated builds).
function(kt_add_python_module name)
  include(CheckIPOSupported)
  check_ipo_supported(RESULT kt_lto_works OUTPUT kt_lto_why LANGUAGES CXX)
  if(kt_lto_works)
    set(kt_lto LTO)
  else()
    message(STATUS "kt: building ${name} without link-time optimization (${kt_lto_why})")
    set(kt_lto "")
  endif()
  nanobind_add_module(${name} STABLE_ABI NB_STATIC NOMINSIZE ${kt_lto} ${ARGN})
  target_compile_features(${name} PRIVATE cxx_std_20)
  kt_target_warnings(${name})
endfunction()

# Compile `sources` for one CPU target into an object library whose code lives in its
# own namespace (the sources read KT_TARGET_NAMESPACE), with that target's -m flags.
# Only these objects ever contain the target's instructions: baseline code stays baseline,
# so no wider instruction can leak into code that runs before the dispatch decision.
function(kt_add_isa_target name)
  cmake_parse_arguments(ARG "" "NAMESPACE" "FLAGS;SOURCES;INCLUDES" ${ARGN})
  add_library(${name} OBJECT ${ARG_SOURCES})
  set_target_properties(${name} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  target_compile_features(${name} PRIVATE cxx_std_20)
  target_compile_options(${name} PRIVATE ${ARG_FLAGS})
  target_compile_definitions(${name} PRIVATE KT_TARGET_NAMESPACE=${ARG_NAMESPACE})
  target_include_directories(${name} PRIVATE ${ARG_INCLUDES})
  kt_target_warnings(${name})
endfunction()

# kt_json_string_list(<out> <json-array>): the strings of a JSON array as a CMake list (backends
# read their targets.json — names, features, -m flags — with it).
function(kt_json_string_list out json)
  set(items "")
  string(JSON n LENGTH "${json}")
  if(n GREATER 0)
    math(EXPR last "${n} - 1")
    foreach(j RANGE ${last})
      string(JSON item GET "${json}" ${j})
      list(APPEND items "${item}")
    endforeach()
  endif()
  set(${out} "${items}" PARENT_SCOPE)
endfunction()
