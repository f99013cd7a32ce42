"""What a run decided: typed records and the recorder that fills them, failure text and its hints,
terminal lines, and the report documents."""
