"""Dispatch: the backends and model pools (the capacity check, least-loaded), a reload's backend changes, health checks
and adaptive capacity."""
