"""ColBench: tasks, environments, simulator client, rollouts and evaluators. Imports no JAX."""
