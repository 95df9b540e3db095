"""Serving: whole requests, queueing, the concurrency decision, pools, elasticities."""
