"""Serving jobs: the table, the pump that leases a node's queued jobs to its stream, and one
handler per job type.
"""
