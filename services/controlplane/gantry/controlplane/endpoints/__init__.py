"""Adopted endpoints (external OpenAI-compatible servers): adoption, sealed credentials, reload
rules and the table.
"""
