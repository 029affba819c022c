"""The relay: a request's trip upstream and back (the proxy, the upstream client, the stream relay, its buffers, stalled
clients, failures)."""
