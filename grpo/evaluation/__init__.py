"""What a run is measured by: the live TPF probe, drift over checkpoints, arm comparisons, their statistics and plots."""
