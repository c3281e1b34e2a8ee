"""Paper-scale simulation: geometry-only models, routing sources, and prefill replayed on the same engine."""
