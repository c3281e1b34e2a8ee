"""The names a plan knob may take, apart from the numpy code that implements them (tiers, grouping, residency):
PlanKnobs and the CLI's flags list them without importing numpy or torch (`--help` stays fast)."""

CAPACITY_RULES = ("tiered", "optimal", "uniform", "max_observed")     # planning/tiers.py
ORDERS = ("popularity", "coactivation")                               # planning/grouping.py
RESIDENCY_MODES = ("threshold", "cost", "all", "makespan")                        # planning/residency.py
