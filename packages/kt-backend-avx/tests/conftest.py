from kt_core.testing.fixtures import clean_kt_environment  # noqa: F401
