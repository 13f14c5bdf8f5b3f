"""What preflight and validate found, in one model: a status, one row per node, the exit code, the JUnit
file, and the timing every check and stage runner applies (below preflight, validate and launch)."""
