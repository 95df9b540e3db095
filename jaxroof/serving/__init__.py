"""Serving: whole requests, queueing, the concurrency decision, pools, elasticities,
arrivals, the continuous-batching simulator and the toy server."""
