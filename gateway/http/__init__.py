"""The gateway's one HTTP server: health, readiness, metrics and the admin API."""
