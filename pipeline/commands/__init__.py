"""The commands: run, plan, report, demo."""
