"""One dtype policy: calibrate, plan and run load the model in the same dtype (`--dtype auto`:
this CPU's fast dtype), and the model fingerprint does not depend on the dtype a run computes in, so README's
calibrate -> plan -> run --plan works on a CPU with native bf16 and on one without (NPUMOE_CPU_FLAGS sets the
flags), and across dtypes (calibrate --dtype fp32, run in bf16)."""
import pytest
import torch

from npumoe_lab import cli
from npumoe_lab.errors import NpuMoeError
from npumoe_lab.models import TINY_MODEL_DIR, load_model, model_fingerprint
from npumoe_lab.planning.profile import CalibrationProfile
from npumoe_lab.results.store import load_results

FLAG_SETS = {"avx2-only": ("avx2,fma", "fp32"), "avx512_bf16+amx": ("avx2,fma,avx512f,avx512_bf16,amx_bf16", "bf16")}


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    if not (TINY_MODEL_DIR / "tokenizer.json").exists():
        pytest.skip("bundled tokenizer not present")
    from tests.model_zoo import save_standin
    return save_standin(tmp_path_factory.mktemp("standin"), TINY_MODEL_DIR)


@pytest.mark.parametrize("cpu", sorted(FLAG_SETS))
def test_readme_workflow_runs_under_both_cpu_flag_sets(cpu, standin, tmp_path, monkeypatch, capsys):
    flags, dtype = FLAG_SETS[cpu]
    monkeypatch.setenv("NPUMOE_CPU_FLAGS", flags)
    monkeypatch.setenv("NPUMOE_CACHE", str(tmp_path / "cache"))
    prof, plan, rows = tmp_path / "profile", tmp_path / "plan.json", tmp_path / "rows"
    assert cli.main(["calibrate", "--model", str(standin), "--workload", "mixed", "--chunk", "64", "--tokens",
                     "256", "--out", str(prof)]) == 0
    assert CalibrationProfile.load(prof).meta["dtype"] == dtype       # auto resolved from the flags
    assert cli.main(["plan", "--profile", str(prof), "--model", str(standin), "--out", str(plan)]) == 0
    capsys.readouterr()
    rc = cli.main(["run", "--model", str(standin), "--workload", "lm-heldout", "--variants", "npumoe",
                   "--platforms", "m2-max", "--plan", str(plan), "--prompt-len", "128", "--chunk", "64",
                   "--n-samples", "1", "--out", str(rows)])
    assert rc == 0, capsys.readouterr().err
    df = load_results(rows)
    assert set(df["dtype"]) == {dtype} and set(df["variant"]) == {"npumoe"}


def test_a_plan_calibrated_in_fp32_runs_in_bf16(standin, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("NPUMOE_CACHE", str(tmp_path / "cache"))
    prof, plan = tmp_path / "profile", tmp_path / "plan.json"
    assert cli.main(["calibrate", "--model", str(standin), "--dtype", "fp32", "--chunk", "64", "--tokens", "128",
                     "--out", str(prof)]) == 0
    assert cli.main(["plan", "--profile", str(prof), "--model", str(standin), "--dtype", "bf16",
                     "--out", str(plan)]) == 0
    capsys.readouterr()
    assert cli.main(["run", "--model", str(standin), "--workload", "lm-heldout", "--variants", "npumoe",
                     "--platforms", "m2-max", "--plan", str(plan), "--prompt-len", "128", "--chunk", "64",
                     "--n-samples", "1", "--dtype", "bf16", "--out", str(tmp_path / "rows")]) == 0


def test_fingerprint_is_the_weights_not_the_dtype(standin, tmp_path):
    prints = {d: model_fingerprint(load_model(standin, dtype=d)[0]) for d in ("fp32", "bf16")}
    assert len(set(prints.values())) == 1, prints          # an fp32 checkpoint, loaded in fp32 or bf16
    half = tmp_path / "fp16"
    load_model(standin, dtype="fp16")[0].save_pretrained(half)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (half / f).write_bytes((standin / f).read_bytes())
    assert len({model_fingerprint(load_model(half, dtype=d)[0]) for d in ("fp32", "bf16", "fp16")}) == 1
    model = load_model(standin, dtype="fp32")[0]
    with torch.no_grad():
        next(model.parameters())[0, 0] += 1.0            # a change far above bf16 precision
    assert model_fingerprint(model, refresh=True) != prints["fp32"]


def test_a_plan_of_other_weights_names_the_cause(standin, tmp_path, monkeypatch, capsys):
    from npumoe_lab.planning.plan import Plan
    monkeypatch.setenv("NPUMOE_CACHE", str(tmp_path / "cache"))
    prof, plan = tmp_path / "profile", tmp_path / "plan.json"
    assert cli.main(["calibrate", "--model", str(standin), "--chunk", "64", "--tokens", "128", "--out", str(prof)]) == 0
    assert cli.main(["plan", "--profile", str(prof), "--out", str(plan)]) == 0
    model = load_model(standin, dtype="fp32")[0]
    with torch.no_grad():
        next(model.parameters())[0, 0] += 1.0
    model_fingerprint(model, refresh=True)
    with pytest.raises(NpuMoeError, match="other weights .the fingerprint does not depend on the dtype"):
        Plan.load(plan).check_model(model)
    with pytest.raises(NpuMoeError, match=r"other weights \(calibrated in (fp32|bf16), this model is loaded in fp16"):
        Plan.load(plan).check_model(load_model(standin, dtype="fp16")[0])
