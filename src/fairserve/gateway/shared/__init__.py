"""What outlives one process: the replicas' shared state in Redis (the sync, its wire format and Lua script, backlog and
leases), or a snapshot file."""
