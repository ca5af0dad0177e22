"""Helpers several test folders share (import them as tests.support.<module>)."""
