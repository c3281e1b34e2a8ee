"""Figures and interactive views: figure catalogue, plot helpers, timeline / plan / adaptive figures, the
figure audit (figcheck) and the plan explorer."""
