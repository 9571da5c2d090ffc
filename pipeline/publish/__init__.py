"""Publishing DIR's view to PostgreSQL: the launcher's part (where to, the diff, the
database's statements, the swap; the workers' part is transforms/publish/)."""
