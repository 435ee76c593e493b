"""Artifact sets: the table, and deleting what operators registered (artifact sets, nodes) under
the deletion rules.
"""
