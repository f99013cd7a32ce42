"""What a run decided: typed records and the recorder that fills them, failure text and its hints,
terminal and progress lines, and the report documents (JSON, Markdown, HTML) with the run's header."""
