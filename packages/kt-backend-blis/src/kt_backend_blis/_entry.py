"""What kt-core imports when it selects kt-backend-blis: the native module, with the crossover
(from how many rows per expert BLIS serves each method) set each time kt-core's selection loads
a table — after `kt_core.backends.selection.reset()` a changed KT_BLIS_MIN_ROWS or calibration
takes effect, as kt-core's own settings do."""

from . import _native, crossover


def backend_api(variant: str):
    crossover.apply(_native)
    return _native.backend_api(variant)
