"""Worker nodes: the WorkerGateway stream, the open worker sessions, liveness, what an inventory
means for residency records, disabling and enabling a node, and the node table.
"""
