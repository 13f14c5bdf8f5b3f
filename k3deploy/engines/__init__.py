"""Engine renderers: Plan + node -> LaunchSpec (argv tuple, env); docker wrapping; exports.

Entry points: `k3deploy.engines.render.render_nodes`, `k3deploy.engines.spec.LaunchSpec`,
`k3deploy.engines.shell.node_shell`. Kept import-free so `planning` can use the pure helpers here
without a cycle.
"""
