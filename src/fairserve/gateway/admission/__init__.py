"""Admission: the scheduler over the ledgers (a request's ticket, its footprint, the queue and the admission pass) and
the numbers summed over the pools."""
