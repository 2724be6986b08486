"""Serving registered models: a real-time REST endpoint and batch inference."""
