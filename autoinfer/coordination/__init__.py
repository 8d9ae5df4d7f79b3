"""Several workers on one study: heartbeats and stale trials, one measurement per host, hardware classes."""
