"""Read: Parquet row groups -> the documents that need work, split into chunks, and what changed against DIR's view."""
