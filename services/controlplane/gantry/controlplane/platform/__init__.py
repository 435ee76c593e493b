"""What every resource package stands on: the database seam and its migrations, the tables,
compare-and-set transitions and the state-machine tables, authentication and credentials, wire
conversion, paging, metrics, the scheduler link and the announcer that tells it what changed,
shared input checks, and the ControlPlane service composed of each resource's RPCs.
"""
