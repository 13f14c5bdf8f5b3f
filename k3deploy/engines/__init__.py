"""Engine renderers: render inputs + node -> LaunchSpec (argv tuple, env); docker wrapping; exports; the
engines' own rules (parallel shape, command-line checks) and data.

Entry points: `k3deploy.engines.render.render_nodes`, `k3deploy.engines.spec.LaunchSpec`,
`k3deploy.engines.shell.node_shell`, `k3deploy.engines.rules.engine_rules`.
"""
