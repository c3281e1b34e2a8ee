"""Flags several commands share, so each says the same thing everywhere."""
from __future__ import annotations

DTYPE_HELP = ("model dtype: auto (default; this CPU's fast dtype: bf16 with avx512_bf16/AMX, else fp32), fp32, bf16. "
              "The same policy in calibrate, plan and run; the model fingerprint does not depend on it")


def add_dtype_argument(p) -> None:
    p.add_argument("--dtype", default="auto", help=DTYPE_HELP)


def add_device_argument(p) -> None:
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda", "mps"),
                   help="where the model's weights and numerics run (default cpu); timing rows stay measured only "
                        "for the host CPU")
