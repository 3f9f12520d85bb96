"""kt_core.testing — what backend authors test with.

- `kt_core.testing.reference`: a float64 NumPy MoE and the error measure.
- `kt_core.testing.plugin`: a pytest plugin (`pytest -p kt_core.testing.plugin --kt-backend NAME
  --pyargs kt_core.testing.conformance`) running the conformance suite for one backend,
  every variant the host can run, against kt-core's reference backend.
"""
