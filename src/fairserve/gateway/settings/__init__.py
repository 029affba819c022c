"""Configuration: the keys (`GatewayConfig`), the live reload in two phases, and the tenant tree's reload."""
