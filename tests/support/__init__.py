"""Helpers the tests share: fake backends and gateways, server processes, raw sockets, a real redis-server, vLLM
fakes, the load generator."""
