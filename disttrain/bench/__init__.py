"""Scaling benchmark: local or emulated hosts, TF's default side by side, the physical bound."""
