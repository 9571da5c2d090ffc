"""The driver's checks before the job: the input, its cheap scan, and what DIR's view already holds."""
