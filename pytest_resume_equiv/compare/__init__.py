"""compare: see docs/concepts.md."""
