"""`npumoe-lab routing-stats`: measure the routing defaults of simulation (per-chunk dispersion, cross-workload
overlap) from the bundled model or calibration profiles, stored with their source."""
from __future__ import annotations


def _routing_stats(a) -> int:
    # lazy: numpy, torch and the bundled model load only when the command runs (`--help` stays fast)
    from pathlib import Path
    import yaml
    from npumoe_lab.errors import NpuMoeError
    from npumoe_lab.planning.profile import CalibrationProfile
    from npumoe_lab.sim.routing_stats import TINY, measure, tiny_profiles
    from npumoe_lab.workloads.texts import DOMAINS
    if bool(a.profile) == bool(a.model):
        raise NpuMoeError("routing-stats needs --model tiny or --profile CAL [--profile RUN ...], not both")
    if a.model:
        if a.model != "tiny":
            raise NpuMoeError(f"routing-stats --model {a.model!r}: only the bundled 'tiny' is calibrated here; "
                              "calibrate another model with `npumoe-lab calibrate` and pass --profile")
        profiles = tiny_profiles()
        cal, runs = profiles.pop("mixed"), profiles
        m = cal.meta
        source = (f"npumoe-lab routing-stats --model tiny: npumoe-tiny {str(m.get('model_fingerprint'))[:12]}, "
                  f"chunk {cal.chunk}, calibration = mixed calib text ({m.get('n_tokens')} tokens), evaluation = "
                  f"held-out text / prompts of {', '.join(runs)} ({TINY['tokens']} tokens each)")
    else:
        profs = [CalibrationProfile.load(p) for p in a.profile]
        cal = profs[0]
        runs = {Path(p).name: q for p, q in zip(a.profile[1:], profs[1:])} or {Path(a.profile[0]).name: cal}
        source = f"npumoe-lab routing-stats --profile {' --profile '.join(a.profile)}"
    doc = measure(cal, runs, source, calibration="+".join(DOMAINS) if a.model else "mixed")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(yaml.safe_dump(doc, sort_keys=False, width=120))
    tmp.replace(out)
    d = doc["defaults"]
    print(f"concentration {d['concentration']['value']}, doc_concentration {d['doc_concentration']['value']}, "
          f"workload_tv_overlap {d['workload_tv_overlap']['value']}, workload {d['workload']['value']}")
    for name, r in doc["measured"].items():
        print(f"  {name}: chunk dispersion {r['chunk_dispersion']:.3f}, doc dispersion {r['doc_dispersion']}, "
              f"1-TV {r['tv_overlap']:.3f}, npumoe-tg drop {r['drop_rate_npumoe_tg']:.1%}, "
              f"pad {r['pad_rate_npumoe_tg']:.1%}")
    print(f"wrote {out}")
    return 0


def register_cli(sub) -> None:
    p = sub.add_parser("routing-stats", help="measure the routing defaults of simulation (per-chunk dispersion, "
                                             "cross-workload overlap) from the bundled model or profiles")
    p.add_argument("--model", help="'tiny': the bundled model (calibrated on mixed text, evaluated on held-out text)")
    p.add_argument("--profile", action="append", help="calibration profile; repeat for evaluation profiles")
    p.add_argument("--out", default="data/routing/tiny-defaults.yaml", help="YAML to write (default data/routing/tiny-defaults.yaml)")
    p.set_defaults(func=_routing_stats)
