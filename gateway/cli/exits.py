"""What ``pluto`` exits with: 0 done, 1 failed (no answer, an error, could not start), 2 a
configuration (or usage) error."""

EXIT_OK, EXIT_FAILED, EXIT_CONFIG = 0, 1, 2
