"""Trajectory records, token examples, pairs and batches. Imports no JAX."""
