"""Data: the record model (``records``), line-numbered readers of the official file formats (``readers``), one
loader per source (``sources``) and question-grouped splits with the contamination filter (``splits``)."""
