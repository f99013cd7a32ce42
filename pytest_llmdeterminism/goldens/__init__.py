"""Golden files: schema and codec, where they live, and candidate review."""
