"""How `k3deploy plan` shows a plan: rich renderables over planning's data (planning itself stays pure arithmetic)."""
