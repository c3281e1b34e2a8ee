"""The demo SUMMARY's accuracy section (experiments/demo.py accuracy_section): the small run's n and its bound said
plainly (hand-computed 1 - 0.05^(1/n)), its verdict quoted, and the recorded n = 300 verdict quoted and labelled."""
import numpy as np
import pandas as pd

from npumoe_lab.experiments.demo import accuracy_section
from npumoe_lab.studies.accuracy_verdict import accuracy_markdown


class _Done:
    def __init__(self, rc):
        self.rc = rc

    def wait(self):
        return self.rc


def _curve(n: int, lost: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    rows, samples = [], []
    for rule in ("weight_x_norm", "random"):
        score = np.ones(n)
        score[:lost if rule == "random" else 0] = 0
        rows.append(dict(model="tiny", variant="npumoe-tg", platform="m2-max", cpu="AMD EPYC", n_samples=n, chunk=256,
                         seed=0, workload="lm-next", difficulty="prompt 512, top_k=2", saliency=rule, percentile=50.0,
                         ref_score=1.0, drop_rate=0.15, accuracy_delta=score.mean() - 1, accuracy_exact_low=-0.1,
                         accuracy_exact_high=0.0, accuracy_lost=n - score.sum(), accuracy_gained=0, mcnemar_p=1.0,
                         loss_ub95=0.01, loss_under_target=rule != "random", nll_delta=0.1, top1_agree=0.9,
                         ttft_s=0.02, ttft_s_lo=0.018, ttft_s_hi=0.035, interval_source="prior", interval_note="",
                         interval_draws=200, prompt_len=512))
        samples += [dict(workload="lm-next", saliency=rule, percentile=50.0, sample=i, ref_score=1.0, score=score[i],
                         nll=1.0 + 0.1 * (rule == "random"), top1_agree=0.9) for i in range(n)]
    return pd.DataFrame(rows), pd.DataFrame(samples)


def test_summary_states_n_bound_and_quotes_the_recorded_n300_verdict(tmp_path):
    out = tmp_path / "demo"
    (out / "accuracy").mkdir(parents=True)
    (out / "accuracy" / "ACCURACY.md").write_text(accuracy_markdown(*_curve(10, 0)))
    recorded = tmp_path / "ACCURACY-tiny-n300.md"
    recorded.write_text(accuracy_markdown(*_curve(300, 3), elapsed_s=1500))
    text = accuracy_section(out, _Done(0), {"n": 10, "percentiles": "50"}, recorded=recorded)
    assert "n = 10 samples per task" in text
    assert "25.9 points" in text                                   # 1 - 0.05 ** (1 / 10) = 0.2589
    assert "recorded, not re-run by the demo" in text and "n = 300" in text
    assert text.count("**lm-next**") == 2                         # the demo's verdict and the recorded one
    assert "Wall time 25.0 min" in text                            # the recorded run's header paragraph
    missing = accuracy_section(out, _Done(1), {"n": 10}, recorded=tmp_path / "none.md")
    assert "failed (exit 1)" in missing and "No recorded n = 300 curve" in missing
