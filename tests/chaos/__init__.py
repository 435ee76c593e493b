"""Chaos suite: real processes, real signals (issue 5, self-healing and truthful state)."""
