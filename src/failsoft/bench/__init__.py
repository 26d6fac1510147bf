"""Benchmarks that print JSON. Speed targets are shown here, never asserted in timed tests."""
