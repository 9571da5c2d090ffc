"""Write: the outputs as Parquet (file sinks, document vectors, the rewrite of a view's files)."""
