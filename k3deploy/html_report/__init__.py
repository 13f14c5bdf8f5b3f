"""Self-contained HTML reports (`plan --html`, `plan --search --workload --html`, `validate --html`)."""
