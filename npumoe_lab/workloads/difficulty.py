"""The calibrated difficulty of each task on the bundled tiny model: the settings the accuracy curve uses by default.

Chosen so the dropless reference scores inside ~0.4-0.9: a saturated task (1.00) cannot show a loss and
one at chance cannot show anything. Prompt length 512 keeps the full curve (4 tasks x 12 plans x 300 samples)
within the bench's 30 minutes on 2 cores; the difficulty comes from distractors, passage length and top-k instead.
Reference scores are MEASURED on this repo's host (see README "Accuracy that can tell variants apart"); they
belong to the bundled model and these settings only. Other models: check or re-choose a setting with
`studies.accuracy_curve.reference_scan` (`bench/accuracy_curve.py --reference-only`).
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Difficulty:
    prompt_len: int
    options: dict = field(default_factory=dict)     # get_workload(name, **options)
    ref_score: float | None = None                  # measured reference score at these settings (tiny model)
    ref_n: int | None = None                        # samples behind ref_score

    def label(self) -> str:
        opts = ", ".join(f"{k}={v}" for k, v in self.options.items())
        return f"prompt {self.prompt_len}" + (f", {opts}" if opts else "")


# reference scores MEASURED on the bundled tiny model (seed 0, the curve's n = 300 samples, AMD EPYC, fp32, chunk
# 256, 2026-12-02, `bench/accuracy_curve.py --reference-only`; docs/figures/accuracy-reference-scan-tiny-n300.csv).
# The settings were chosen by the n = 60 scan in README (0.850 / 0.700 / 0.600 / 0.617 there); all four stay
# inside 0.4-0.9 at n = 300, so none was re-chosen.
TINY_DIFFICULTY: dict[str, Difficulty] = {
    "ruler-multikey": Difficulty(512, {"n_needles": 16, "key_nouns": 2}, 0.863, 300),
    "ruler-vt": Difficulty(512, {"n_vars": 4, "n_chains": 4, "vary_len": True}, 0.740, 300),
    "fewshot-cls": Difficulty(512, {"query_len": 8}, 0.573, 300),
    "lm-next": Difficulty(512, {"top_k": 2}, 0.547, 300),
}
DEFAULT_TASKS = tuple(TINY_DIFFICULTY)


def difficulty_for(name: str, prompt_len: int | None = None, **options) -> Difficulty:
    """The calibrated setting of a task, with `prompt_len` / options overriding it (a task without a
    calibrated setting: its own defaults at prompt_len, 512 when not given)."""
    base = TINY_DIFFICULTY.get(name, Difficulty(512))
    return Difficulty(prompt_len or base.prompt_len, {**base.options, **options},
                      base.ref_score if prompt_len in (None, base.prompt_len) and not options else None,
                      base.ref_n if prompt_len in (None, base.prompt_len) and not options else None)
