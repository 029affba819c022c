"""Quotas: tokens and service per hour, day or month per tenant or group (the book, the gate on the request path, the
stores)."""
