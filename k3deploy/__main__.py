"""`python -m k3deploy` runs the CLI."""
from k3deploy.cli import main

main()
