"""Reports of pipeline runs: a run's results tables and plots, several seeds pooled, the testbed's sweep (run_report),
the testbed's judges and policies (testbed_report), paired differences with bootstrap intervals (paired_stats)."""
