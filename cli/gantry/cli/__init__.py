"""The `gantry` command: role processes, the local supervisor (`up`) and operator commands."""
