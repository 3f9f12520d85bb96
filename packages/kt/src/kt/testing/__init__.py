"""Test helpers of the application: small Hugging Face checkpoints and GGUF files written by the
tests themselves (kt-core's conformance helpers are kt_core.testing)."""
