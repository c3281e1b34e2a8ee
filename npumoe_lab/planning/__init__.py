"""Planning: from a calibration profile to a static plan (profile, knobs, tiers, grouping, residency, plan,
the compiled layout the engine reads, variants). Pure data and decisions: no torch execution."""
