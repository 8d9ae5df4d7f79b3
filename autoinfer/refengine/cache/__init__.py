"""Caches of the reference engine: expert residency (slots on the device) and GDN state snapshots."""
