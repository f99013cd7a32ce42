"""Golden files: the entry's schema, the file's codec, atomic writes and the folder lock, the store
that reads and merges files, where they live, and candidate review."""
