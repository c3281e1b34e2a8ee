"""`npumoe-lab routing-stats`: measure the routing defaults of simulation (per-chunk dispersion, cross-workload
overlap) from the bundled model or calibration profiles, stored with their source."""
from __future__ import annotations

DEFAULT_OUT = "data/routing/tiny-defaults.yaml"


def _premise(a) -> int:
    # lazy: numpy, pandas and matplotlib load only when the command runs
    from pathlib import Path
    import yaml
    from npumoe_lab.sim.routing_premise import figure, premise_stats, verdict
    from npumoe_lab.sim.textlike_measure import measure_textlike
    df, facts = premise_stats(a.routing)
    data, out = facts["data"], Path(a.out)
    per = df[df["domain"] != "all"]
    head = verdict(df)
    p = data.provenance
    lines = [f"# Routing premise check: {a.routing}", "",
             f"Data: {facts['folder']} ({p.get('model')}; {p.get('tool')}; phase {p.get('phase')}; layers "
             f"{p.get('layers', data.layers)} of {len(p['geometry']['moe_layers'])}; licence {p.get('licence')}).",
             *[f"- {n}" for n in p.get("notes", [])], "", f"**Verdict: {head}**", "",
             "Rule: weak when the median Gini is below 0.15 (no hot set), or when the median hot-10 % Jaccard "
             "against the calibration mix is below 0.5 or its 1 - TV below 0.8 (the hot set moves); calibration = "
             "the other domains (leave one out). Drop / padding: the default npumoe-tg plan (m2-max, chunk 512, "
             "prompt 2048), MODELED routing where the data holds counts only.", "",
             "| domain | median Gini | median hot-10 % share | median 1-TV vs calib | median hot-10 % Jaccard | "
             "npumoe-tg drop | padding |", "|---|---|---|---|---|---|---|"]
    for d, g in df.groupby("domain", sort=False):
        lines.append(f"| {d} | {g.gini.median():.3f} | {g.hot10_share.median():.1%} | "
                     f"{g.overlap_vs_calib.median():.3f} | {g.hot10_jaccard_vs_calib.median():.2f} | "
                     f"{g.drop_rate.mean():.1%} | {g.pad_rate.mean():.1%} |")
    lines += ["", f"{len(per)} rows per layer and domain in routing_stats.csv; routing_stats.png: popularity "
                  "heatmap and overlap per layer."]
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "routing_stats.csv", index=False)
    (out / "ROUTING_STATS.md").write_text("\n".join(lines) + "\n")
    if a.routing != "tiny":
        doc = measure_textlike(a.routing)
        (out / "textlike.yaml").write_text(yaml.safe_dump(doc, sort_keys=False, width=120))
        lines.append(f"textlike.yaml: the text-like model's parameters for this data (copy it into "
                     f"{facts['folder'].name}/ to make them its counts: defaults): " + ", ".join(
                         f"{k} {v['value']}" for k, v in doc["defaults"].items()))
        (out / "ROUTING_STATS.md").write_text("\n".join(lines) + "\n")
    figure(df, data, f"{a.routing}: {head.split(':')[0]}").savefig(out / "routing_stats.png", dpi=130)
    print("\n".join(lines[6:]))
    print(f"wrote {out}/routing_stats.csv, ROUTING_STATS.md, routing_stats.png" +
          (", textlike.yaml" if a.routing != "tiny" else ""))
    return 0


def _routing_stats(a) -> int:
    if a.routing:
        if a.model or a.profile:
            from npumoe_lab.errors import NpuMoeError   # lazy: as below
            raise NpuMoeError("routing-stats --routing SOURCE checks the premise of one source; give it without "
                              "--model/--profile")
        if a.out == DEFAULT_OUT:
            a.out = "results/routing-stats"
        return _premise(a)
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
    p.add_argument("--routing", help="the premise check of a routing source instead: counts:NAME|DIR, trace:NAME|DIR, "
                                     "a routing-import folder, or tiny (the bundled model); --out is then a folder "
                                     "(routing_stats.csv, ROUTING_STATS.md, routing_stats.png)")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"YAML to write (default {DEFAULT_OUT}); with --routing a "
                                                      "folder (default results/routing-stats)")
    p.set_defaults(func=_routing_stats)
