"""A restricted unpickler for routing counts shipped as pickles (OLMoE's expert_counts/*.pkl: a list of
`collections.Counter{expert_id: count}` with NumPy scalar keys and values). Plain `pickle.load` runs whatever a file
names; this one resolves only `collections.Counter` and the NumPy scalar/dtype constructors, so a pickle naming any
other global is refused before anything of it runs."""
from __future__ import annotations

import io
import pickle
from pathlib import Path

from npumoe_lab.errors import NpuMoeError

ALLOWED = {
    ("collections", "Counter"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "scalar"),       # NumPy < 2 pickles scalars with this path
    ("numpy._core.multiarray", "scalar"),      # NumPy >= 2
}


class _Restricted(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) not in ALLOWED:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed (only collections.Counter and "
                                         "NumPy scalars)")
        if module == "collections":
            import collections
            return collections.Counter
        import numpy as np
        if name == "dtype":
            return np.dtype
        try:                                     # the scalar constructor (both module paths name it)
            from numpy._core import multiarray
        except ImportError:
            from numpy.core import multiarray
        return multiarray.scalar


def load_restricted(path) -> object:
    """The object of a pickle file, refused in one line (naming the file) if it names any other global."""
    p = Path(path)
    try:
        return _Restricted(io.BytesIO(p.read_bytes())).load()
    except pickle.UnpicklingError as exc:
        raise NpuMoeError(f"{p}: refused pickle ({exc}); routing pickles may hold only Counters of NumPy "
                          "scalars") from None
    except (EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError) as exc:
        raise NpuMoeError(f"{p}: not a readable pickle ({type(exc).__name__}: {exc}); is the file truncated?") \
            from None


__all__ = ["load_restricted", "ALLOWED"]
