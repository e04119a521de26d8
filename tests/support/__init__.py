"""Helpers and files the tests share: imported as ``tests.support.<module>``."""
