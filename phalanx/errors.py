"""User-facing errors: one line that names the input and what is wrong."""


class PhalanxError(Exception):
    """An error the user caused (bad flag, bad file, bad trace row).

    The CLI prints ``phalanx: error: <message>`` and exits non-zero, never a traceback.
    """


class ConfigError(PhalanxError):
    """A configuration value is out of range or inconsistent."""


class DataError(PhalanxError):
    """A data file is missing, truncated or corrupt."""
