"""One module per paper figure or claim; each defines EXPERIMENT."""
