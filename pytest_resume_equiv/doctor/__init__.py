"""`python -m pytest_resume_equiv doctor`: can this machine run resume tests, and will their
verdicts be exact?

One command a user runs first on a new box (and CI runs before the resume tests): the
environment and the device the plugin would pick, the process-group backends that come up,
a real resume test of a tiny built-in trainer on the device, whether two uninterrupted runs
are bitwise equal, and whether every rank leaves after `destroy_process_group`. Each check is
one row (ok / warn / fail, what was seen, the fix); `cli.py` prints them and writes the JSON.

This package's `ranks.py` runs inside ranks and imports neither pytest nor the plugin side;
importing this package imports nothing else, so a rank pays nothing for it.
"""
