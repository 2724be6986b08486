"""Metrics and plots of a served model on the validation and test splits."""
