"""Tasks: dataset builders to verl's parquet format and reward functions registered for verl."""
