"""report: see docs/concepts.md."""
