from kt_core.testing.fixtures import clean_kt_environment, run_python  # noqa: F401
