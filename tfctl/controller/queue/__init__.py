"""A user's queue of runs on pools: `submit` records a run as queued, the queue's driver (one
process per user and run store) starts each when its pool has room, and every tfctl command
brings the driver back if it is gone while runs wait.
"""
