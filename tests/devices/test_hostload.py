"""Noise-aware measurement: `npumoe-lab run --platform cpu` flags its rows host_busy and warns once while a
synthetic CPU-bound job runs beside it, and does neither on a quiet host."""
from __future__ import annotations

import subprocess
import sys
import time
import warnings

import numpy as np
import psutil
import pytest

from npumoe_lab import cli
from npumoe_lab.devices.hostload import IQR_LIMIT, OTHER_CORES_LIMIT, STEAL_LIMIT, HostBusyWarning, HostLoad
from npumoe_lab.results.store import load_results
from npumoe_lab.models import TINY_MODEL_DIR

SPIN = "import time\nt = time.time()\nwhile time.time() - t < 120: pass"


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    if not (TINY_MODEL_DIR / "tokenizer.json").exists():
        pytest.skip("bundled tokenizer not present")
    from tests.model_zoo import save_standin
    return save_standin(tmp_path_factory.mktemp("standin"), TINY_MODEL_DIR)


def _run(standin, out, monkeypatch, prompt_len=256, extra=()):
    monkeypatch.setenv("NPUMOE_CACHE", str(out / "cache"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rc = cli.main(["run", "--model", str(standin), "--workload", "lm-heldout", "--variant",
                       "reference,npumoe", "--platform", "cpu", "--prompt-len", str(prompt_len), "--chunk", "128",
                       "--samples", "1", "--calib-tokens", "1024", "--threads", "1", *extra,
                       "--out", str(out / "rows")])
    assert rc == 0
    return load_results(out / "rows"), [w for w in caught if issubclass(w.category, HostBusyWarning)]


def _others_busy_cores(seconds=1.0) -> float:
    """Independent reading: cores used by everything but this process over a short window."""
    me = psutil.Process()
    t0, a0, m0 = time.perf_counter(), psutil.cpu_times(), sum(me.cpu_times()[:2])
    time.sleep(seconds)
    t1, a1, m1 = time.perf_counter(), psutil.cpu_times(), sum(me.cpu_times()[:2])
    busy = sum(getattr(a1, f) - getattr(a0, f) for f in ("user", "nice", "system", "irq", "softirq"))
    return (busy - (m1 - m0)) / (t1 - t0)


def test_busy_host_flags_rows_and_warns_once(standin, tmp_path, monkeypatch):
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(psutil.cpu_count())]
    try:
        time.sleep(0.5)
        df, warned = _run(standin, tmp_path, monkeypatch)
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    assert len(df) == 2 * 3 and (df.repeat.nunique() == 3)        # measured: 3 repeats by default
    assert df.host_busy.all(), df[["variant", "host_other_cores", "host_busy_reason"]]
    assert (df.host_other_cores > OTHER_CORES_LIMIT).all()
    assert df.host_busy_reason.str.contains("other processes used").all()
    assert len(warned) == 1 and "host_busy" in str(warned[0].message)
    # median / IQR stored per configuration, computed over the repeats' TTFT
    for _, g in df.groupby("variant"):
        t = g.sort_values("repeat").ttft_s.to_numpy()
        assert g.ttft_median_s.iloc[0] == pytest.approx(np.median(t))
        assert g.ttft_iqr_s.iloc[0] == pytest.approx(np.percentile(t, 75) - np.percentile(t, 25))


def test_quiet_host_is_not_flagged_for_its_own_load(standin, tmp_path, monkeypatch):
    """On a quiet host the run's own CPU time is not counted as others' load, and the busy flag says exactly what
    an independent recomputation of the repeats' spread says. The spread itself is the VM's to decide: a quiet
    CI VM once gave a 25 % IQR over 5 repeats of a ~48 ms prefill, and flagging that is the detector's job."""
    if _others_busy_cores() > OTHER_CORES_LIMIT / 2:
        pytest.skip("other processes are using this host's CPUs right now: a quiet run cannot be checked")
    df, warned = _run(standin, tmp_path, monkeypatch, prompt_len=512, extra=("--repeats", "5"))
    assert df.repeat.nunique() == 5
    # judged by the independent reading, not the detector's own columns (those are what is under test)
    if _others_busy_cores() > OTHER_CORES_LIMIT / 2 or (df.host_steal_frac > STEAL_LIMIT).any():
        pytest.skip("another process or the hypervisor took CPU during the run")
    # the run kept one core busy itself: had its own time been counted, others' cores would read ~1
    assert (df.host_other_cores < OTHER_CORES_LIMIT).all()
    assert not df.host_busy_reason.str.contains("other processes|steal").any()
    for variant, g in df.groupby("variant"):
        t = g.ttft_s.to_numpy()
        spread = (np.percentile(t, 75) - np.percentile(t, 25)) / np.median(t)
        assert g.host_busy.nunique() == 1 and g.host_busy_reason.nunique() == 1   # one verdict per configuration
        row = g.iloc[0]
        assert row.host_busy == (spread > IQR_LIMIT), (variant, spread, row.host_busy_reason)
        assert row.host_busy_reason == (f"TTFT IQR {spread:.0%} of the median" if spread > IQR_LIMIT else "")
    assert len(warned) == int(df.host_busy.any())


def test_iqr_over_the_limit_flags_even_without_other_load():
    load = HostLoad()                                 # nothing measured: no other-load reading
    spread = load.columns([1.0, 1.0 + 2 * IQR_LIMIT, 1.0 + 4 * IQR_LIMIT])
    assert spread["host_busy"] and "IQR" in spread["host_busy_reason"]
    assert not load.columns([1.0, 1.01, 1.02])["host_busy"]


def test_repeats_interleave_the_variants(standin, tmp_path, monkeypatch):
    """Within each repeat and sample every variant runs once before the next repeat starts (a slow spell of the
    host then hits all variants alike), and a modeled platform gets one repeat by default."""
    from npumoe_lab.experiments import interleave
    from npumoe_lab.experiments.runner import run_experiment
    monkeypatch.setenv("NPUMOE_CACHE", str(tmp_path / "cache"))
    order, restore = [], interleave.restore
    monkeypatch.setattr(interleave, "restore", lambda model, snap: (order.append(id(snap[0])), restore(model, snap)))
    df = run_experiment(model=str(standin), workload="lm-heldout", variants="reference,npumoe-base,npumoe",
                        platforms="m2-max", prompt_len=256, chunk=128, n_samples=2, calib_tokens=1024, warmup=0,
                        repeats=2, share_numerics=False)   # every repeat its own forward: the order is visible
    assert len(order) == 2 * 2 * 3 and len(set(order)) == 3
    first = order[:3]
    assert order == first * 4                 # ref, base, npumoe, ref, base, npumoe, ... never ref, ref, ...
    assert sorted(df.repeat.unique()) == [0, 1]
    one = run_experiment(model=str(standin), workload="lm-heldout", variants="npumoe", platforms="m2-max",
                         prompt_len=256, chunk=128, n_samples=1, calib_tokens=1024, warmup=0)
    assert list(one.repeat) == [0] and "host_busy" not in one.columns   # host load concerns measured rows only


def _load_with(monkeypatch, *readings):
    load = HostLoad()
    load.n_cpus = 2
    it = iter(readings)
    monkeypatch.setattr(load, "_snapshot", lambda: next(it))
    with load.measuring():
        pass
    return load.columns([1.0, 1.0, 1.0])


def test_host_load_arithmetic_on_fixed_counter_readings(monkeypatch):
    """others' cores = (system busy - steal - own) / wall, steal share = steal / (wall x cpus), on hand-made
    (time, system busy, steal, own CPU) readings: independent of what else runs on the test machine."""
    quiet = _load_with(monkeypatch, (10.0, 100.0, 5.0, 40.0), (12.0, 102.0, 5.0, 42.0))   # all busy time ours
    assert quiet["host_other_cores"] == 0.0 and quiet["host_steal_frac"] == 0.0
    assert not quiet["host_busy"] and quiet["host_busy_reason"] == ""
    busy = _load_with(monkeypatch, (20.0, 200.0, 5.0, 50.0), (22.0, 205.0, 5.4, 52.0))
    # others: 5 - 0.4 - 2 = 2.6 s over 2 s wall; steal 0.4 s over 2 s x 2 cpus
    assert busy["host_other_cores"] == pytest.approx(1.3) and busy["host_steal_frac"] == pytest.approx(0.1)
    assert busy["host_busy"] and busy["host_busy_reason"] == "other processes used 1.30 cores; steal 10%"


def _scripted(load, snapshots):
    """HostLoad reading scripted (time, all busy, steal, own) snapshots instead of the kernel's counters."""
    it = iter(snapshots)
    load._snapshot = lambda: next(it)
    return load


def test_short_calls_read_the_load_over_their_span_not_a_single_tick():
    """Two 0.1 ms calls 1.2 s apart on a quiet host: one 10 ms /proc/stat tick of another process lands inside the
    first. Over the calls alone that reads as 50 cores; over the span (1.2 s, 12 ms of others' CPU) 0.01 cores."""
    load = _scripted(HostLoad(), [(0.0, 0.0, 0.0, 0.0), (1e-4, 0.010, 0.0, 0.0),        # call 1: the tick
                                  (1.2, 0.012, 0.0, 0.0), (1.2001, 0.012, 0.0, 0.0)])   # call 2
    for _ in range(2):
        with load.measuring():
            pass
    assert load.other_cpu_s / load.wall_s == pytest.approx(50.0)           # what the calls alone would say
    cols = load.columns([1e-4, 1e-4])
    assert cols["host_other_cores"] == pytest.approx(0.012 / 1.2001)
    assert not cols["host_busy"]


def test_a_busy_span_still_flags_and_too_short_a_span_is_waited_out():
    busy = _scripted(HostLoad(), [(0.0, 0.0, 0.0, 0.0), (1e-4, 0.0, 0.0, 0.0),
                                  (1.5, 1.5, 0.0, 0.0), (1.5001, 1.5, 0.0, 0.0)])     # another process: 1 core
    # 0.1 ms in all (one tick inside): read again after a wait; quiet around the call -> 0.01 / 0.2 cores
    short = _scripted(HostLoad(), [(0.0, 0.0, 0.0, 0.0), (1e-4, 0.01, 0.0, 0.0), (0.2, 0.01, 0.0, 0.0)])
    for load in (busy, short):
        for _ in range(2 if load is busy else 1):
            with load.measuring():
                pass
    cols = busy.columns([1e-4, 1e-4])
    assert cols["host_other_cores"] == pytest.approx(1.5 / 1.5001) and cols["host_busy"]
    assert "other processes used" in cols["host_busy_reason"]
    t0 = time.perf_counter()
    cols = short.columns([1e-4])
    assert cols["host_other_cores"] == pytest.approx(0.01 / 0.2) and not cols["host_busy"]
    assert time.perf_counter() - t0 > 0.15                        # it waited for the counters to resolve
    assert short.columns([1e-4])["host_other_cores"] == cols["host_other_cores"]      # once per HostLoad


def test_long_calls_keep_the_reading_over_the_calls_alone():
    """>= MIN_RESOLVED_S of measured calls: the untimed gap between them (others busy there) does not count."""
    from npumoe_lab.devices.hostload import MIN_RESOLVED_S
    w = MIN_RESOLVED_S
    load = _scripted(HostLoad(), [(0.0, 0.0, 0.0, 0.0), (w, 0.0, 0.0, 0.0),
                                  (5 * w, 8 * w, 0.0, 0.0), (6 * w, 8 * w, 0.0, 0.0)])
    for _ in range(2):
        with load.measuring():
            pass
    cols = load.columns([w, w])
    assert cols["host_other_cores"] == 0.0 and not cols["host_busy"]
