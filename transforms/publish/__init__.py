"""Publishing a view into PostgreSQL: the workers' part (rows from the view's files into the
database by binary COPY) and the table's columns (pipeline/publish/ is the launcher's part)."""
