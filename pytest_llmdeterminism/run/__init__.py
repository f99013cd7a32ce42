"""One pytest run: options, per-test settings, the fixtures' objects, outcomes, the end-of-run writer."""
