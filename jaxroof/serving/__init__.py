"""Serving: whole requests, arrivals, the continuous-batching simulator, the toy server."""
