"""Results: the atomic parquet store, output folders, result-row metrics and exact accuracy statistics."""
