"""Entry point of `python -m k3deploy.sim`, the stand-in engine for tests and demos (not a model server)."""

from k3deploy.sim.cli import main

raise SystemExit(main())
