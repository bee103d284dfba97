"""HTML and PDF report builder. Not built yet."""
