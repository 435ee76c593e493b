"""The model host: one child process per resident deployment, and the worker's seam to it.

Import the seam from `gantry.worker.model_host.process`; `child` is the child's entry point and
must stay importable without the parent's asyncio machinery.
"""
