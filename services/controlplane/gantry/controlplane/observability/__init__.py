"""What operators see: the observability and state-history RPCs, the audit trail and its feed,
invariants, snapshots and state counts.
"""
