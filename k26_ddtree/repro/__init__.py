"""Reproduction: machine setup, environment snapshots and the SHA256 manifest of the repro package."""
