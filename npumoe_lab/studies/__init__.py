"""Studies built on the engine: accuracy harness, drift-adaptive runs, knob tuning."""
