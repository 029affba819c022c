"""`fairserve serve`: an OpenAI-compatible server on a real engine whose own scheduler is VTC."""
