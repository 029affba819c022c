"""Rate caps: requests and tokens per UTC minute per tenant or group (the caps and their count, the stores, the gate
on the request path)."""
