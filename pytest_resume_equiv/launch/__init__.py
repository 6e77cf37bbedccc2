"""launch: see docs/concepts.md."""
