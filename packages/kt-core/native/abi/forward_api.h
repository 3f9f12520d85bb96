// kt/forward.h's table: a layer's forward submitted to and awaited on the process pool from
// any non-worker thread, without Python (device bridges such as kt-cuda call it from CUDA
// host functions).
#pragma once
#include <kt/forward.h>

namespace kt {

const kt_forward_api* forward_api();

}  // namespace kt
