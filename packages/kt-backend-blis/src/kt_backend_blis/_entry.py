"""What kt-core imports when it selects kt-backend-blis: the native module, with the crossover
(from how many rows per expert BLIS serves each method) set before any table is handed out."""

from . import _native, crossover

crossover.apply(_native)
backend_api = _native.backend_api
