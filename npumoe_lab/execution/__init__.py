"""Execution: one engine for measured and modeled prefill (ops, clock, engine, runtime, experts path, geometry,
timeline scheduling, routing capture, calibration runs, drift monitor)."""
