"""``opbench cluster``: every GPU, node and link of a cluster measured in one job, the slow ones named, and a
pass/fail verdict with an exit code. docs/cluster.md explains the checks, the outlier rule and the schedule."""
