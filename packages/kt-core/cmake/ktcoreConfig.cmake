# CMake package config shipped inside the kt-core wheel, for building backends against
# the installed kt-core:  find_package(ktcore CONFIG REQUIRED
#                                      HINTS "$(python -c 'import kt_core; print(kt_core.get_cmake_dir())')")
# Provides the interface target kt::plugin (include path of kt/plugin.h) and the helpers
# of KtCommon.cmake (kt_add_python_module, kt_add_isa_target).
get_filename_component(_kt_core_root "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
if(NOT TARGET kt::plugin)
  add_library(kt::plugin INTERFACE IMPORTED)
  set_target_properties(kt::plugin PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_kt_core_root}/include")
endif()
include("${CMAKE_CURRENT_LIST_DIR}/KtCommon.cmake")
set(ktcore_INCLUDE_DIR "${_kt_core_root}/include")
unset(_kt_core_root)
