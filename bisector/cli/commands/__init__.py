"""One module per command; cli.py registers them."""
