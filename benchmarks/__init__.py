"""Speed and memory benchmarks. Each module prints a table and updates its own section of
``reports/benchmarks.md``; ``python -m benchmarks`` runs them all."""
