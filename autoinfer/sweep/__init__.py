"""The sweep loop: ask a trial, run it isolated, record it; confirmation, drift, repeats, the report."""
