"""The LM head of a prefill: what the first token needs, apart from what scoring needs.

TTFT is the time to the first generated token, which needs the logits of the prompt's last token only; a serving
engine projects that one position (HF's `logits_to_keep`, as HF's `generate` does) and a modeled prefill prices
just that (geometry.rest_op). So the timed forward of a chunk keeps the last real position's logits in the
prompt's last chunk and none in the others. Scoring a prompt (NLL, agreement with the reference, the first token
of a decode) needs every position's logits: `chunk_logits` computes them after the chunk's time is taken, from
the decoder's final hidden states (`FinalHidden`), with the projection HF's own forward runs over the whole chunk
(same module, same [chunk, H] operand), so the same bits as the logits HF's forward returns."""
from __future__ import annotations

import torch

from npumoe_lab.errors import NpuMoeError
from npumoe_lab.models import get_family


class FinalHidden:
    """Holds the decoder's last hidden states [B, chunk, H] (after its final norm) of each forward of `model`
    (an HF *ForCausalLM): a forward hook on its base model, removed by `remove()`."""

    def __init__(self, model):
        base = getattr(model, "base_model", model)
        if base is model or model.get_output_embeddings() is None:
            raise NpuMoeError(f"{type(model).__name__} has no separate decoder and LM head; load an HF "
                              "*ForCausalLM of a supported family")
        self.hidden = None
        self._handle = base.register_forward_hook(self._keep)

    def _keep(self, module, args, output):
        self.hidden = output[0] if isinstance(output, tuple) else output.last_hidden_state

    def scoring_logits(self, model, out, c: int, n_real: int, keep: bool):
        """After a chunk's forward `out` (its time taken): one clear error on a NaN in its hidden states or its
        kept logits, then every real position's logits [B, n_real, V] where `keep`, else None."""
        check_finite(self.hidden[:, :n_real], c)
        check_finite(out.logits, c, "logits")       # the last token's, in the last chunk (else empty)
        scored = None
        if keep:
            scored = chunk_logits(model, self.hidden)[:, :n_real]
            check_finite(scored, c, "logits")
        self.hidden = None
        return scored

    def remove(self) -> None:
        self._handle.remove()


def keep_positions(n_real: int, last_chunk: bool, device) -> torch.Tensor:
    """HF's `logits_to_keep` for a chunk with `n_real` real tokens (padding after them): the last real position
    in the prompt's last chunk, no position in the others (a [B, 0, V] projection)."""
    return torch.tensor([n_real - 1] if last_chunk else [], dtype=torch.long, device=device)


def chunk_logits(model, hidden: torch.Tensor) -> torch.Tensor:
    """Every position's logits [B, chunk, V] from the decoder's final hidden states, as the family's
    *ForCausalLM computes them (its LM head, then e.g. GraniteMoE's division by `logits_scaling`)."""
    logits = model.get_output_embeddings()(hidden)
    divisor = get_family(model).logits_divisor(model.config)
    return logits / divisor if divisor is not None else logits


def check_finite(x: torch.Tensor, c: int, what: str = "hidden states") -> None:
    """One clear error where a chunk's hidden states (or its scoring logits) hold a NaN."""
    if not bool(torch.isfinite(x.sum())) and bool(torch.isnan(x).any()):
        raise NpuMoeError(f"NaN in the {what} of prefill chunk {c}; check the model weights/dtype")


__all__ = ["FinalHidden", "keep_positions", "chunk_logits", "check_finite"]
