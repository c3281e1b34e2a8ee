"""`load_model`: a local HF checkpoint (or the bundled "tiny" model) ready for CPU prefill experiments.

Attention is "eager" by default: GPT-OSS has no sdpa path (attention sinks), eager handles left padding without
fully-masked-row special cases, and it is deterministic, which the bit-identical capture tests rely on. Attention
is the same in every variant, so the choice does not bias variant comparisons; pass attn_implementation="sdpa"
for faster long-prompt reference runs on families that support it."""
from __future__ import annotations

from pathlib import Path

import torch

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.utils import DATA_DIR, hf_progress
from npumoe_lab.models.registry import find_moe_blocks, get_family

TINY_MODEL_DIR = DATA_DIR / "models" / "npumoe-tiny"
_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def resolve_model_dir(name_or_path) -> Path:
    if str(name_or_path) == "tiny":
        if not (TINY_MODEL_DIR / "config.json").is_file():
            raise NpuMoeError(f"the bundled tiny model is missing at {TINY_MODEL_DIR}; build it with "
                              f"`npumoe-lab train-tiny` or pass a local HF checkpoint directory")
        return TINY_MODEL_DIR
    path = Path(name_or_path).expanduser()
    if not (path / "config.json").is_file():
        raise NpuMoeError(f"{name_or_path!s} is not a model directory (no config.json there); pass a local HF "
                          f"checkpoint directory (download it first, e.g. with `hf download`) or 'tiny'")
    return path


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def resolve_dtype(dtype) -> torch.dtype:
    """None -> float32: checkpoints stored in bf16/fp16 are upcast, the CPU reference runs in fp32."""
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    if str(dtype) in _DTYPES:
        return _DTYPES[str(dtype)]
    raise NpuMoeError(f"dtype {dtype!r} is not supported; use one of {', '.join(_DTYPES)} or a torch.dtype")


def load_model(name_or_path, dtype=None, *, attn_implementation: str = "eager", device: str = "cpu"):
    """-> (model in eval mode, tokenizer or None when the directory has no tokenizer files). `device`: cpu | cuda |
    mps, where the weights and the numerics live (loaded in `dtype` directly: a bf16 checkpoint is never upcast)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    path = resolve_model_dir(name_or_path)
    torch_dtype = resolve_dtype(dtype)
    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError, KeyError) as exc:   # broken JSON, unknown model_type, missing fields
        raise NpuMoeError(f"{path / 'config.json'} cannot be read as an HF config ({_first_line(exc)}); restore the "
                          "checkpoint's config.json (or download the checkpoint again)") from None
    family = get_family(config)
    if not family.moe_layers(config):  # checked on the config so a dense model fails before loading weights
        raise NpuMoeError(f"the {config.model_type} model at {path} has no MoE layers (every layer is dense under "
                          f"its config); the workbench needs a model with at least one MoE layer")
    try:
        with hf_progress():   # the weight-loading bar: off under NPUMOE_NO_PROGRESS and in sweep cells
            model = AutoModelForCausalLM.from_pretrained(path, config=config, dtype=torch_dtype,
                                                         attn_implementation=attn_implementation)
    except OSError as exc:
        raise NpuMoeError(f"could not load the weights of {path}: {exc}; check the checkpoint files") from exc
    model.eval()
    if device != "cpu":
        ok = {"cuda": torch.cuda.is_available, "mps": lambda: torch.backends.mps.is_available()}.get(device)
        if ok is None or not ok():
            raise NpuMoeError(f"--device {device} is not available on this machine (use cpu" +
                              (", or a machine with CUDA / Apple MPS)" if ok else "; one of cpu, cuda, mps)"))
        model.to(device)
    if not find_moe_blocks(model):
        raise NpuMoeError(f"the {config.model_type} model at {path} has no MoE blocks after loading; "
                          f"the workbench needs a model with at least one MoE layer")
    has_tokenizer = any((path / f).is_file() for f in _TOKENIZER_FILES)
    tokenizer = AutoTokenizer.from_pretrained(path) if has_tokenizer else None
    return model, tokenizer
