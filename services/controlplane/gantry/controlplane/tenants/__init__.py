"""Tenants and their scheduling policies: the RPCs, the pure policy rules and the table."""
