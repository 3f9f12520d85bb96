"""Exceptions kt raises. Each message says what was expected, what was found, what to do."""


class KTError(Exception):
    """Base class of kt's own errors."""


class BackendError(KTError):
    """No usable backend, or a backend that cannot be loaded or used."""


class BackendSelectionError(BackendError):
    """KT_BACKENDS / KT_CPU_VARIANT / KT_MAX_ISA ask for something this host cannot give."""


class WeightsError(KTError, ValueError):
    """Expert weights of the wrong shape, dtype or count."""


class SettingError(KTError, ValueError):
    """A KT_* variable or a pool setting outside what it takes (a ValueError to Python callers)."""
