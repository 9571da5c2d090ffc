"""Write: the outputs as Parquet (every output's files, document vectors, the rewrite of a view's files)."""
