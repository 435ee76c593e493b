"""The evidence pipeline: assessments (INSPECT), runtime profiles, probes (PROBE), candidates and
approvals; its RPCs, its job handlers and its pure rules.
"""
