"""Developer tools run from the repository (make targets): not part of the package workers install."""
