"""Text in: packaged and user corpora (read in bounded pieces), WordNet senses, corpus transforms and token classes."""
