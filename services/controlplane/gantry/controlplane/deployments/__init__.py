"""Deployments and their residencies: lifecycle (deploy, unload, delete, restart, scale),
placement, the reconciler, settling, reclaim, surplus drains, autoscaling, capability bindings,
and their pure rules.
"""
