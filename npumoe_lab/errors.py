"""The one exception type the workbench raises for bad input."""


class NpuMoeError(ValueError):
    """Bad input or an impossible request. The message names what is wrong and what to do."""
