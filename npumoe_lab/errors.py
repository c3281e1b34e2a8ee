"""The one exception type the workbench raises for bad input, and the base of its warnings."""
import warnings


class NpuMoeError(ValueError):
    """Bad input or an impossible request. The message names what is wrong and what to do."""


class NpuMoeWarning(UserWarning):
    """A workbench warning (host busy, routing drift): printed as one line, without Python echoing the source line
    that raised it (the message already says what happened and what to do)."""


_format = warnings.formatwarning


def _one_line(message, category, filename, lineno, line=None):
    if isinstance(category, type) and issubclass(category, NpuMoeWarning):
        return f"{category.__name__}: {message}\n"
    return _format(message, category, filename, lineno, line)


warnings.formatwarning = _one_line     # wraps the default: every other warning prints as before
