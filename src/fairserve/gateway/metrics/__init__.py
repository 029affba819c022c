"""What the gateway reports: /metrics (Prometheus) and the usage log."""
