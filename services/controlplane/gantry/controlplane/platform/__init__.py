"""What every resource package stands on: the database seam and its migrations, the tables,
compare-and-set transitions and the state-machine tables, authentication and credentials, wire
conversion, paging, metrics, the scheduler link, the domain events a commit publishes and the
announcer that tells the scheduler what they mean, shared input checks, and the ControlPlane
service composed of each resource's RPCs.
"""
