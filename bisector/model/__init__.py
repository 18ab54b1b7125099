"""The model side: catalog (nodes, candidates, pinned), inputs, golden outputs, Polygraphy file formats."""
