"""What the user sees in a terminal: help, progress, the short summary."""
