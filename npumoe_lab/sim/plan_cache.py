"""A keyed on-disk cache of a simulation's built plans and their compiled execution layouts.

NPUMoE builds its plans offline, once per calibration and device; a simulation rebuilt all of them on every call
(tiers, groups, the residency search against the platform's cost model, the layer checks and the plan's hash:
~45 % of a paper grid once its routing draws come from their cache). A plan is a pure function of what planning
reads, and that is its key: the calibration profile (its count, stat and co-activation tables and its meta), the
layer specs, the platform (name, content hash of its parameters after overrides, both device models), the plan
knobs with the variant's forced ones, the variant's attention placement (the NPU program budget keeps programs
for attention on the NPU), and the source text of the code that plans (the planning, devices and core packages)
with NumPy's version. A hit is the pickled (plan, layout) a fresh build gives, so every row is the same; a
changed key part is a miss. Location: cache_dir()/plans. Bypass: `NPUMOE_PLAN_CACHE=off` (`simulate --no-cache`
and `sweep --no-cache` set it with the draws' switch; the test suite sets it off unless a test turns it on).
A platform that is not a loaded `Platform` (a test's stand-in) or a knob with no canonical bytes is never cached.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from pathlib import Path

from npumoe_lab.devices.platform import Platform
from npumoe_lab.sim import keyed_store
from npumoe_lab.utils import cache_dir

ENV = "NPUMOE_PLAN_CACHE"
PLANNING_PACKAGES = ("planning", "devices", "core")


def enabled() -> bool:
    return keyed_store.switched_on(ENV)


def folder() -> Path:
    return cache_dir() / "plans"


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """The hash of every module of the planning, devices and core packages (tiers, grouping, residency, the cost
    models it searches with, the layout compiler) and NumPy's version."""
    root = keyed_store.PACKAGE_ROOT
    return keyed_store.source_version(sorted(p for pkg in PLANNING_PACKAGES for p in (root / pkg).rglob("*.py")))


def profile_digest(profile) -> str:
    """The content hash of a calibration profile's tables and meta (kept on the profile: it is read-only)."""
    got = profile.__dict__.get("_plan_cache_digest")
    if got is None:
        h = hashlib.sha256()
        for name in ("counts", "stats", "coactivation"):
            df = getattr(profile, name)
            keyed_store.feed(h, None if df is None else
                             [name, [str(c) for c in df.columns], df.index.to_numpy(),
                              [df[c].to_numpy() for c in df.columns]])
        keyed_store.feed(h, json.dumps(profile.meta, sort_keys=True, default=repr))
        got = profile.__dict__["_plan_cache_digest"] = h.hexdigest()
    return got


def _platform_part(platform):
    """The content hash of a platform's part of the key, kept on the platform like a profile's (it is read-only;
    a warm sweep cell keys 16 plans over 4 platforms, and hashing both device models' fields each time was a
    quarter of its time). None for a stand-in (never cached)."""
    if not isinstance(platform, Platform):
        return None
    got = platform.__dict__.get("_plan_cache_digest")
    if got is None:
        h = hashlib.sha256()
        keyed_store.feed(h, [platform.name, platform.hash, platform.kind, platform.npu_shares_cpu,
                             dataclasses.asdict(platform.npu), dataclasses.asdict(platform.cpu)])
        got = platform.__dict__["_plan_cache_digest"] = h.hexdigest()
    return got


@functools.lru_cache(maxsize=32)
def _specs_digest(specs: tuple) -> str:
    """The digest of the layer specs' fields (frozen dataclasses: equal specs, equal digest)."""
    h = hashlib.sha256()
    keyed_store.feed(h, [sorted(vars(s).items()) for s in specs])
    return h.hexdigest()


def plan_key(variant, specs, profile, platform, knobs: dict) -> str | None:
    """The entry name of a variant's plan, or None where it cannot be keyed (never cached). `knobs`: the given
    knobs with the variant's forced ones on top; with the attention placement that is all a variant changes in its
    plan (npumoe and npumoe-spill share one)."""
    try:
        plat = _platform_part(platform)
        if plat is None:
            return None
        return keyed_store.entry_name("plan", code_version(), [
            variant.attention, sorted(knobs.items(), key=repr), _specs_digest(tuple(specs)), profile_digest(profile),
            plat])
    except TypeError:
        return None


def cached_plan(variant, specs, profile, platform, knobs: dict, build):
    """build() -> (plan, layout), read from the cache where this exact build was made before."""
    name = plan_key(variant, specs, profile, platform, knobs) if enabled() else None
    if name is not None:
        hit = keyed_store.load(folder(), name)
        if hit is not None:
            return hit
    built = build()
    if name is not None:
        keyed_store.store(folder(), name, built)
    return built
