"""What a run decided, as failure text, terminal lines and report documents."""
