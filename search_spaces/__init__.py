"""Search-space data shipped with planner (hardware catalogue TOML files)."""
