"""One-off development tools: profiles, op censuses, launch-configuration sweeps."""
