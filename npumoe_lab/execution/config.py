"""What a prefill checks and how it is configured, apart from runtime.py: `check_context`, `check_chunk`,
`check_lengths` and `PrefillConfig` import without torch or transformers, so a routing-only simulation (sim/run.py)
uses the same checks and configuration as a real prefill (runtime.py re-exports every name)."""
from __future__ import annotations

from dataclasses import dataclass

from npumoe_lab.devices import as_platform
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.execution.clock import TimelineClock
from npumoe_lab.execution.ops import ChunkContext

ATTENTION_ROLES = ("npu", "cpu")


def check_context(context: int | None, tokens: int, what: str = "the prompt") -> None:
    """The one context-length check: `tokens` must fit the model's context."""
    if context is not None and tokens > context:
        raise NpuMoeError(f"{what} has {tokens} tokens but the model's context is {context}; use at most "
                          f"{context} (a shorter --prompt-len or --chunk)")


def check_chunk(chunk) -> int:
    """The one check of a prefill chunk size (PrefillConfig runs it; so does anything that takes a chunk before it
    makes its configs)."""
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise NpuMoeError(f"chunk must be an integer >= 1; got {chunk!r}")
    return chunk


def check_lengths(prompt_len, chunk, whole_chunks: bool = False) -> None:
    """The one prompt-length / chunk check of the commands: both integers >= 1, the chunk no longer than the prompt
    (a 256-token prompt has no 512-token chunk), and with `whole_chunks` the prompt a multiple of the chunk."""
    for flag, v in (("--prompt-len", prompt_len), ("--chunk", chunk)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise NpuMoeError(f"{flag} {v!r} must be an integer >= 1 (tokens)")
    if chunk > prompt_len:
        raise NpuMoeError(f"--chunk {chunk} is larger than the prompt (--prompt-len {prompt_len}): the prefill would "
                          f"have no chunk of {chunk} tokens; use --chunk <= {prompt_len}")
    if whole_chunks and prompt_len % chunk:
        lo, hi = prompt_len // chunk * chunk, -(-prompt_len // chunk) * chunk
        raise NpuMoeError(f"--prompt-len {prompt_len} is not a multiple of --chunk {chunk} (whole chunks only); use "
                          + (f"{lo} or {hi}" if lo else f"{hi}"))


@dataclass(frozen=True)
class PrefillConfig:
    """Where and how a prefill runs and is timed, resolved once: the chunk, the platform (None: untimed), measured or
    modeled, the NPU's precision. It travels whole: `chunked_prefill` and the replay make each chunk's context
    from it (`chunk_context`)."""
    platform: object                       # devices.Platform (a name is resolved here); None: an untimed prefill
    chunk: int
    attention: str = "npu"                 # role of attention and the dense parts ("npu" | "cpu")
    pad_token_id: int = 0
    dtype_bytes: int = 2                   # bytes per element on the modeled device (fp16)

    def __post_init__(self):
        object.__setattr__(self, "platform", as_platform(self.platform))
        check_chunk(self.chunk)
        if self.attention not in ATTENTION_ROLES:
            raise NpuMoeError(f"attention={self.attention!r}: use one of {ATTENTION_ROLES}")

    @staticmethod
    def untimed(chunk: int, pad_token_id: int = 0) -> "PrefillConfig":
        """A prefill with no clock (calibration, references, warm-up): only the chunking matters."""
        return PrefillConfig(None, chunk, attention="cpu", pad_token_id=pad_token_id)

    @property
    def measured(self) -> bool:
        return self.platform is not None and self.platform.kind == "measured"

    @property
    def npu_weight_bytes(self) -> int | None:
        """The platform's stored NPU weight size (npu weight_bytes, e.g. 1 for int8); None: the dtype's."""
        return getattr(getattr(self.platform, "npu", None), "weight_bytes", None)

    def chunk_context(self, index: int, n_real: int, clock, numerics: bool = True) -> ChunkContext:
        """Chunk `index` of a prefill in this configuration (`n_real` real tokens, the rest padding)."""
        return ChunkContext(index=index, past=index * self.chunk, n_real=n_real, length=self.chunk, clock=clock,
                            numerics=numerics, dtype_bytes=self.dtype_bytes, npu_weight_bytes=self.npu_weight_bytes)

    @property
    def npu_dtype(self) -> torch.dtype | None:  # noqa: F821 (a string: torch loads only where numerics run)
        """The NPU role's precision: a modeled ANE computes fp16; on a measured host groups keep the model's."""
        import torch     # lazy: only the numerics path asks for a dtype
        return None if self.measured else torch.float16

    def clock(self) -> TimelineClock:
        return TimelineClock(self.platform, measured=self.measured)


__all__ = ["ATTENTION_ROLES", "PrefillConfig", "check_chunk", "check_context", "check_lengths"]
