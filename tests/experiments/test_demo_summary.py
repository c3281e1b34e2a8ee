"""SUMMARY.md labels each metric with the rows' own source: a measured `cpu` row's energy is measured time x
modeled power and its cycles measured CPU time x the nominal clock, never plain "measured". Reference: the rows'
timing_source / energy_source / cycles_source columns, read back from the table SUMMARY writes."""
import pandas as pd

from npumoe_lab.execution.timeline import CPU_TIME_X_CLOCK, TIME_X_POWER
from npumoe_lab.experiments.demo import summary_markdown

HEADER = "| variant | platform | TTFT source |"


def summary_sources(text: str) -> dict:
    """{(variant, platform): (TTFT, energy, cycles source)} from every SUMMARY variant table."""
    out, cols = {}, None
    for line in text.splitlines():
        if line.startswith(HEADER):
            cols = [c.strip() for c in line.strip("|").split("|")]
            continue
        if cols and line.startswith("|") and not line.startswith("|---"):
            cells = dict(zip(cols, (c.strip() for c in line.strip("|").split("|"))))
            out[(cells["variant"], cells["platform"])] = (cells["TTFT source"], cells["energy source"],
                                                         cells["cycles source"])
        elif not line.startswith("|"):
            cols = None
    return out


def rows_sources(df: pd.DataFrame) -> dict:
    return {(v, p): tuple(g[c].iloc[0] for c in ("timing_source", "energy_source", "cycles_source"))
            for (v, p), g in df.groupby(["variant", "platform"])}


def _rows() -> pd.DataFrame:
    rows = []
    for plat, kind in (("cpu", "measured"), ("m2-max", "modeled")):
        for i, v in enumerate(("reference", "cpu-only", "npumoe-base", "npumoe")):
            for repeat in range(2):
                rows.append(dict(variant=v, platform=plat, prompt_len=256, chunk=128, repeat=repeat,
                                 ttft_s=0.01 * (i + 1), energy_per_token_mj=1.0 + i, cpu_cycles=1e8, n_npu_calls=4,
                                 drop_rate=0.01, score=0.5, timing_source=kind, platform_kind=kind,
                                 energy_source=TIME_X_POWER if kind == "measured" else "modeled",
                                 cycles_source=CPU_TIME_X_CLOCK if kind == "measured" else "modeled"))
    return pd.DataFrame(rows)


def test_summary_labels_match_the_rows():
    df = _rows()
    text = summary_markdown(df, {"model": "tiny"})
    got = summary_sources(text)
    assert got == rows_sources(df) and len(got) == 8
    assert got[("npumoe", "cpu")] == ("measured", "measured-time x modeled-power", "measured-cpu-time x modeled-clock")
    assert "measured-time x modeled-power" in text.split("|", 1)[0]          # and the intro says what it means


def test_rows_without_a_label_say_so():
    text = summary_markdown(_rows().drop(columns=["cycles_source"]), {})
    assert {s[2] for s in summary_sources(text).values()} == {"not recorded"}
